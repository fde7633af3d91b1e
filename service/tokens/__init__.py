"""Projects and their bearer tokens (stored as SHA-256 hashes)."""
