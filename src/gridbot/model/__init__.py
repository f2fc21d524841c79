"""Plain typed records and their state machines: bags, jobs, instances, hosts."""
