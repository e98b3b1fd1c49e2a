package obj_test

// The obj tier's actor against a real versitygw on loopback: round trip
// with every byte verified, HEAD lookups from a fresh tier, a corrupt object
// deleted, transient errors retried, an endpoint that dies made unhealthy
// and recovered by the probe.

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"net/http"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/obj"
	"github.com/kvtier/kvtier/tiers/obj/objtest"
	"github.com/kvtier/kvtier/tiers/tiermsg"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	blockBytes = 8 << 10
	bucket     = "kvtier"
)

var ns = messages.Layout{Model: "obj-test", DType: "fp16", BlockTokens: 16, TPSize: 1}.Namespace()

func key(i int) messages.Key {
	var b [32]byte
	binary.BigEndian.PutUint64(b[:], uint64(i))
	return messages.Key{Namespace: ns, Hash: string(b[:]), Group: uint32(i % 3)}
}

func block(i int) ([]byte, uint32) {
	b := make([]byte, blockBytes)
	for j := range b {
		b[j] = byte(i*131 + j*7)
	}
	return b, crc32.Checksum(b, blockfmt.Castagnoli)
}

// tierHarness runs an obj tier named "obj" whose hub drops what the test
// does not read past its buffer.
type tierHarness struct{ *tiertest.Harness }

func openTier(t *testing.T, s *objtest.Server, tweak func(*obj.Config)) *tierHarness {
	t.Helper()
	cfg := obj.Config{
		Endpoint:      obj.Endpoint{Endpoint: s.Endpoint, Bucket: bucket, AccessKey: objtest.AccessKey, SecretKey: objtest.SecretKey},
		Prefix:        "node-a/",
		MaxBlockBytes: blockBytes,
		RetryBase:     5 * time.Millisecond,
		ProbeMin:      5 * time.Millisecond,
		ProbeMax:      50 * time.Millisecond,
		Log:           zerolog.Nop(),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	tier, err := obj.Open(cfg)
	require.NoError(t, err)
	return &tierHarness{tiertest.Start(t, tier.Props, tiertest.Options{Name: "obj", Timeout: 30 * time.Second,
		Events: 4096, Drop: true, Medium: messages.MediumStorage, Ownership: "obj", Locality: "REMOTE", Close: tier.Close})}
}

func (h *tierHarness) write(i int) error {
	src, sum := block(i)
	return h.Ask(&tiermsg.Write{Corr: 1, Key: key(i), Src: src, Checksum: sum}).(*tiermsg.WriteResult).Err
}

func (h *tierHarness) read(i int) ([]byte, error) {
	dst := make([]byte, blockBytes)
	r := h.Ask(&tiermsg.Read{Corr: 2, Key: key(i), Dest: dst}).(*tiermsg.ReadResult)
	return dst, r.Err
}

func (h *tierHarness) lookup(ids ...int) []bool {
	ks := make([]messages.Key, len(ids))
	for i, id := range ids {
		ks[i] = key(id)
	}
	r := h.Ask(&tiermsg.Lookup{Corr: 3, Keys: ks}).(*tiermsg.LookupResult)
	require.NoError(h.T, r.Err)
	return r.Found
}

func (h *tierHarness) stats() messages.SecondaryStats {
	return h.Ask(&tiermsg.StatsQuery{}).(*tiermsg.StatsReply).Stats
}

func (h *tierHarness) awaitHealth(healthy bool) {
	h.T.Helper()
	objtest.AwaitHealth(h.T, h.Ctx, h.System.Root, h.PID, healthy)
}

func TestRoundTripVerifiedAndHeadLookups(t *testing.T) {
	s := objtest.Start(t, bucket)
	h := openTier(t, s, nil)
	for i := range 6 {
		require.NoError(t, h.write(i))
	}
	require.NoError(t, h.write(0), "already stored: answered at once")
	for i := range 6 {
		got, err := h.read(i)
		require.NoError(t, err)
		want, _ := block(i)
		require.True(t, bytes.Equal(want, got), "block %d", i)
	}
	st := h.stats()
	require.Equal(t, uint64(6), st.Writes)
	require.Equal(t, uint64(6), st.Reads)
	require.Equal(t, -1, st.Blocks, "an object tier does not count its bucket")

	// The object name is derived from the key only.
	raw, err := s.Client(bucket)
	require.NoError(t, err)
	defer raw.Close()
	_, err = raw.Raw().StatObject(h.Ctx, bucket, "node-a/"+blockfmt.RelPath(key(1)), minio.StatObjectOptions{})
	require.NoError(t, err)

	// A second tier over the same bucket knows nothing yet: it HEADs.
	fresh := openTier(t, s, nil)
	require.Equal(t, []bool{true, false, true}, fresh.lookup(2, 99, 5))
	require.Equal(t, uint64(2), fresh.stats().Found)
	other := openTier(t, s, func(c *obj.Config) { c.Prefix = "node-b/" })
	require.Equal(t, []bool{false}, other.lookup(2), "another prefix is another tier")
}

func TestCorruptObjectDeletedNeverServed(t *testing.T) {
	s := objtest.Start(t, bucket)
	h := openTier(t, s, func(c *obj.Config) { c.Workers = 1 })
	require.NoError(t, h.write(7))
	raw, err := s.Client(bucket)
	require.NoError(t, err)
	defer raw.Close()
	name := "node-a/" + blockfmt.RelPath(key(7))
	objtest.Corrupt(t, h.Ctx, raw, bucket, name, func(data []byte) { data[len(data)-1] ^= 0xff })

	_, err = h.read(7)
	require.ErrorIs(t, err, messages.ErrInvalidBlock)
	require.ErrorIs(t, err, messages.ErrChecksum)
	st := h.stats()
	require.Equal(t, uint64(1), st.Invalid)
	// The delete was queued before the answer went out; with one worker the
	// lookup's HEAD runs after it.
	require.Equal(t, []bool{false}, h.lookup(7))
	_, err = raw.Raw().StatObject(h.Ctx, bucket, name, minio.StatObjectOptions{})
	require.Equal(t, http.StatusNotFound, minio.ToErrorResponse(err).StatusCode, "the bad copy is deleted")
}

// A 503 is retried after a backoff and the read succeeds; a run of them
// makes the tier unhealthy until the probe finds the endpoint well.
func TestTransientErrorsRetriedThenUnhealthy(t *testing.T) {
	s := objtest.Start(t, bucket)
	var faulty *obj.Faulty
	h := openTier(t, s, func(c *obj.Config) {
		m, err := obj.NewMinio(c.Endpoint)
		require.NoError(t, err)
		faulty = obj.NewFaulty(m)
		c.Client = faulty
	})
	require.NoError(t, h.write(1))
	busy := minio.ErrorResponse{StatusCode: http.StatusServiceUnavailable, Code: "SlowDown"}
	n := 0
	remove := faulty.Inject(func(_ context.Context, op obj.Op, _ string) error {
		if op == obj.OpGet && n < 1 {
			n++
			return busy
		}
		return nil
	})
	got, err := h.read(1)
	remove()
	require.NoError(t, err)
	want, _ := block(1)
	require.Equal(t, want, got)
	require.Equal(t, uint64(1), h.stats().RetriedIOCalls)
	require.True(t, h.stats().Healthy)

	remove = faulty.Inject(func(context.Context, obj.Op, string) error { return busy })
	defer remove()
	for i := range 3 {
		_, err := h.read(1)
		require.ErrorIs(t, err, messages.ErrTierUnavailable, "read %d", i)
	}
	h.awaitHealth(false)
	require.ErrorIs(t, h.write(2), messages.ErrTierUnavailable, "writes are shed while unhealthy")
	require.Equal(t, []bool{false}, h.lookup(1), "lookups answer absent at once")
	st := h.stats()
	require.Equal(t, uint64(1), st.Unhealthy)
	require.Equal(t, uint64(1), st.WritesShed)
	remove()
	h.awaitHealth(true)
	got, err = h.read(1)
	require.NoError(t, err)
	require.Equal(t, want, got)
}

// The server dies: the tier goes unhealthy on the refused connection, sheds
// writes, answers lookups at once, and recovers when the server is back on
// the same endpoint over the same directory, serving what it held before.
func TestEndpointDownAndBack(t *testing.T) {
	s := objtest.Start(t, bucket)
	h := openTier(t, s, nil)
	require.NoError(t, h.write(3))
	s.Kill()
	_, err := h.read(3)
	require.ErrorIs(t, err, messages.ErrTierUnavailable)
	h.awaitHealth(false)
	require.ErrorIs(t, h.write(4), messages.ErrTierUnavailable)
	require.Equal(t, []bool{false, false}, h.lookup(3, 4))
	require.NoError(t, s.Restart(h.Ctx))
	h.awaitHealth(true)
	got, err := h.read(3)
	require.NoError(t, err)
	want, _ := block(3)
	require.Equal(t, want, got)
	require.Equal(t, uint64(1), h.stats().Unhealthy)
}
