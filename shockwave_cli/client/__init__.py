"""The command line's side of the REST API: a small HTTP client and how its answers are shown
(rich tables for people, JSON or YAML for scripts)."""
