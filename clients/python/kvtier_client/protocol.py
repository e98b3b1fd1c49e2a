"""The engine protocol's constants, generated from the Go codec's table
(scheduler/wire: go test ./scheduler/wire -run TestPythonProtocol -update).
Do not edit: a change here is a change to the codec."""

PROTOCOL_VERSION = 1

# Lookup statuses.
MISS = 0
HIT = 1
HIT_PENDING = 2
RETRY = 3

# Operations, by wire name, and their numbers.
OPS = {
    "hello": 1,
    "ping": 2,
    "bye": 3,
    "lookup": 4,
    "prepare_load": 5,
    "touch": 6,
    "complete_load": 7,
    "prepare_store": 8,
    "complete_store": 9,
    "job_done": 10,
    "request_finished": 11,
    "take_events": 12,
    "has_pending_work": 13,
    "pause": 14,
    "resume": 15,
    "reset_cache": 16,
    "stats": 17,
    "grant": 18,
    "store": 19,
    "batch": 20,
}

# Error codes a reply may carry.
CODES = frozenset({
    "FULL",
    "UNKNOWN_KEY",
    "NOT_PENDING",
    "NOT_LOADING",
    "UNKNOWN_JOB",
    "BAD_WORKER",
    "BAD_KEY",
    "PAUSED",
    "CLOSED",
    "BAD_CONFIG",
    "CHECKSUM",
    "BAD_REQUEST",
    "BAD_VERSION",
    "UNKNOWN_OP",
    "NO_SESSION",
    "BUSY",
    "SIZING",
    "TIMEOUT",
    "INTERNAL",
})

# Bounds every decoder enforces.
MAX_FRAME_BYTES = 33554432
MAX_HASH_BYTES = 64
MAX_KEYS = 65536
MAX_BATCH_CALLS = 4096
