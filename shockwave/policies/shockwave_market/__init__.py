"""The Shockwave policy: a volatile Fisher market planned over a window of rounds.

``shockwave`` is the policy (contention, predicted regimes, the window plan and its reuse);
``shockwave_typed`` plans it per GPU type on a heterogeneous cluster. Registered by name
(``shockwave``) in ``shockwave.policies``.
"""
