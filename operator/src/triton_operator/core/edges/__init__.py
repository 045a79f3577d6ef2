"""The pure halves of the I/O edges: retry backoff, secrets redacted from text, kopf's peering rule."""
