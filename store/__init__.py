"""The audit trail: schema, the single writer, the hash chain, queries, replay."""
