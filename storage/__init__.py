"""What goes to disk: files.py (atomic writes, sha256, the latest-run link: everything that writes uses it)
and checkpoint.py (checksummed checkpoint directories, verified on every load)."""
