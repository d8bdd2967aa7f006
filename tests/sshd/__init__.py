"""Real OpenSSH sshd nodes on loopback for tests (see :mod:`tests.sshd.fleet`)."""
