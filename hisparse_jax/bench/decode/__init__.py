"""`hisparse-bench decode`: decode throughput at the capacity wall, HiSparse vs full-KV.

plan (arguments -> the runs and their batches), capacity (the byte account and the largest batch
that fits), working_memory (the compiled program's memory), synthetic (a long-context state
without prefill), runner (building and timing the runs), report (rows, ratios, table), plots
(throughput and TPOT against context), command (the subcommand's body), bitwise (HiSparse vs
full-KV tokens and logits, bit for bit, at a realistic shape).
"""
