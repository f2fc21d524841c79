"""The dispatcher: events in, decisions out, with no I/O and no clock (time is an argument)."""
