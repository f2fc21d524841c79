"""The execution client: pulls instances from the server, runs them, reports."""
