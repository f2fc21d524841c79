"""Who may do what: keys and their roles, the access file clients read, host credentials and TLS.

docs/security.md has the threat model; this package is the mechanism, used by the server, the
client, the worker and the command line.
"""
