"""MySQL 8+ and MariaDB 10.6+ over asyncmy (and MySQL before 8 through an override)."""
