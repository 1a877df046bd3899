"""The single audit writer and the per-run recorders that feed it, one module per part:

* frames — the wire format between the recorders and the writer process;
* database — opening the database for writing (schema, upgrade refusal, free space, anchor);
* sealer — rows into the hash chains, blobs, signed checkpoints, the host key (Signer);
* process — the writer process and its handle in the host (AuditWriter, AuditFailure);
* assembler — register writes become `log_spi` / `log_writes` rows;
* recorder — the per-run API the stages use (Recorder, NullWriter).

Import each name from its module; this package itself imports none of them, so that a
command that needs one part does not load the others.
"""
