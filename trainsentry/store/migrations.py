"""Versioned DDL steps: MIGRATIONS[n] upgrades a database from version n-1 to n.

Version 1 is created from `schema.metadata` directly, so it has no steps. A later change
adds e.g. `MIGRATIONS[2] = ["ALTER TABLE alerts ADD COLUMN team TEXT"]` and bumps
`schema.SCHEMA_VERSION`; a test checks both stay in step.
"""

MIGRATIONS: dict[int, list[str]] = {1: []}
