"""The data layer shared by the API and the solver service: tables, queries, the cluster version."""
