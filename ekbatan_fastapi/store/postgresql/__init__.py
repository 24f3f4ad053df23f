"""PostgreSQL 12+ over asyncpg."""
