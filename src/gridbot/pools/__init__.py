"""Pool adapters: submit, status and cancel pilots (execution clients) in each pool."""
