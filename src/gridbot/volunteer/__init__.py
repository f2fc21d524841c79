"""Volunteers: stock BOINC clients as a gridbot pool (`kind = "volunteer"`, docs/volunteers.md).

The BOINC side of the server speaks what the unmodified client expects (master page, scheduler RPC,
downloads with Range, the upload handler) and hands every scheduler request to the same Service path
the HTTP workers use, so the bags' policies, replication, deadlines and host statistics apply as they are.
"""
