"""The I/O port: the Host protocol and LiveHost, the snapshot host, commands with deadlines, files read under
a root, network look-ups, the state file. Probes read the machine only through here."""
