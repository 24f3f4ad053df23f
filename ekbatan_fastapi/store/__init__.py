"""The store: the tables, the connections, one module of statements per dialect, and the
migrations. The only code that writes SQL."""
