"""kvtier as SGLang's HiCache storage backend (docs/SGLANG.md)."""
