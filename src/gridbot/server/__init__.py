"""The HTTP server: worker protocol, submitter API, and the service that owns the dispatcher."""
