"""The Python core every face of libddl shares (ddl.torch, ddl.tensorflow, ddl.keras): joining the
world and its topology, Horovod's build flags and settings, op names, process sets and errors. Each
face only converts its framework's tensors and maps its conventions onto this."""
