"""The job queue, end to end, against real PostgreSQL, SQLite and MariaDB databases."""
