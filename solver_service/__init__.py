"""The solver service: the Celery shell around the scheduling core, and the round driver.

Planning reads a snapshot of the cluster from the database (:mod:`store.snapshot`),
runs the cluster's policy from the core's registry and stores the plan
(:mod:`solver_service.planning`). Celery workers run it on the dedicated ``solver`` queue
(:mod:`solver_service.celery_app`, :mod:`solver_service.tasks`); the API (through the port its
composition root hands it) and the round driver ask for plans through
:mod:`solver_service.enqueue`, which also runs them in-process for the embedded deployment.
Importing this package does nothing.
"""
