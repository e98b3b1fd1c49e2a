// Package obj is the S3-compatible object secondary tier (docs/DESIGN.md §5.4):
// one object per block, written and read through minio-go by a bounded pool
// of I/O workers outside the tier's actor.
//
// Layout: <prefix><namespace>/<2-hex shard>/<hex hash>-<group>.blk, names
// derived from the key only (tiers/blockfmt, the same as the fs tier's
// paths), each object the shared header (with the block's provenance) then
// the block. Every read verifies header, key, length, provenance and CRC32C;
// a copy that fails is deleted, counted, and never served.
//
// Events: the tier announces to the node's event hub (medium STORAGE,
// locality REMOTE) the blocks it vouches for — written or read and verified
// by it, with their provenance — within the KnownKeys bound, and removes
// those it finds bad, deletes, or stops vouching for.
//
// Index: none kept from a LIST. A bucket is typically shared by many nodes
// and outlives each of them, so a listing taken at start is stale as soon as
// another node writes, and costs O(bucket) requests at every start. Lookups
// instead HEAD each key not already known (bounded concurrency, within the
// lookup deadline); keys this tier wrote, found or read are remembered in a
// bounded set so a block it holds is found without a round trip.
//
// Failures: transient errors (5xx, 429, timeouts, resets) are retried with
// backoff by timer messages, only while the operation's deadline allows and
// at most MaxAttempts times. A refused connection, an unknown host, bad
// credentials or a missing bucket (or UnhealthyAfter transient failures in a
// row) make the tier unhealthy: lookups answer at once that nothing is held,
// reads and writes are refused (writes counted as shed), queued operations
// fail at once, and a probe armed as a timer message with backoff
// (ProbeMin doubling to ProbeMax) brings it back when the endpoint answers.
// No timer runs while the tier is healthy or idle.
//
// NB: while unhealthy a tiermsg.Lookup is answered Found all false with Err nil:
// a definite "not here" that turns into a MISS on the engine's next step,
// within the lookup deadline. (The tiering actor now also counts an Err
// answer as absent for its negative-cache TTL, so either answer is safe;
// this one keeps the tier's behaviour independent of that.)
//
// Every S3 call goes through the narrow Client interface: Minio for a real
// endpoint, Faulty to inject errors and stalls in tests.
package obj
