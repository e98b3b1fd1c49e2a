package node

// The S3 object tier through a whole node, against a real versitygw on
// loopback (tiers/obj/objtest): cascade then promotion with every byte
// verified, the server killed mid-run and restarted behind the same
// endpoint over the same directory, a corrupt object, metrics. The node runs on a manual clock:
// the lookup deadline, the negative cache and the tier's health probe move
// only when a test advances it, so "never waits past the deadline" is shown
// by answers that change from RETRY to MISS with the clock standing still.

import (
	"net/http"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/obj"
	"github.com/kvtier/kvtier/tiers/obj/objtest"
	"github.com/kvtier/kvtier/tiers/tiering"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

const objBucket = "kvtier-test"

func withObj(s *objtest.Server, tweak ...func(*config.TierConfig)) func(*config.Config) {
	return func(c *config.Config) {
		tc := config.TierConfig{Kind: "obj", Endpoint: s.Endpoint, Bucket: objBucket, Prefix: "node/",
			AccessKey: objtest.AccessKey, SecretKey: objtest.SecretKey}
		for _, f := range tweak {
			f(&tc)
		}
		c.SecondaryTiers = append(c.SecondaryTiers, tc)
	}
}

func (h *harness) objPID() *actor.PID {
	return actor.NewPID(h.node.system.Address(), "kvtier/tier-obj")
}

// awaitObjHealth returns once the obj tier's health is healthy.
func (h *harness) awaitObjHealth(healthy bool) {
	h.t.Helper()
	objtest.AwaitHealth(h.t, h.ctx, h.node.system.Root, h.objPID(), healthy)
}

func TestObjCascadeThenPromotion(t *testing.T) {
	s := objtest.Start(t, objBucket)
	h := open(t, 8, withObj(s))
	_, ts := h.cascadeThenPromote("obj", "promoted from S3")
	require.Zero(t, ts.LookupsTimedOut)
	require.Equal(t, "obj", ts.Tiers[0].Kind)
	require.True(t, ts.Tiers[0].Healthy)
	require.False(t, h.pending(), "secondary work is never engine work")
}

// The server is killed mid-run: cascades are shed (counted), lookups turn
// from RETRY to MISS within one step with the clock standing still (no
// deadline had to pass), nothing stays pinned; the server comes back behind
// the same endpoint over the same directory, the probe (a timer on the node's clock) finds
// it, and every block stored before the kill is a HIT again, every byte
// verified.
func TestObjServerKilledAndRestarted(t *testing.T) {
	s := objtest.Start(t, objBucket)
	h := open(t, 16, withObj(s))
	before := ids(0, 8)
	h.store(&messages.ReqContext{RequestID: "w"}, before...)
	h.idle()
	require.Equal(t, uint64(8), h.tiering().CascadeWritten["obj"])
	h.evictAll(16)

	s.Kill()
	h.store(&messages.ReqContext{RequestID: "during"}, ids(100, 4)...)
	h.idle()
	h.awaitObjHealth(false)
	ts := h.tiering()
	require.Equal(t, uint64(4), ts.CascadeDropped["obj"], "cascades to a dead endpoint are shed")
	require.False(t, ts.Tiers[0].Healthy)
	require.Equal(t, uint64(1), ts.Tiers[0].Unhealthy)

	req := &messages.ReqContext{RequestID: "r"}
	ks := keys(before...)
	require.Equal(t, messages.Retry, h.lookup(req, ks, true)[0])
	h.idle()
	require.Equal(t, statuses(len(ks), messages.Miss), h.lookup(req, ks, true),
		"an unhealthy tier turns RETRY into MISS on the next step")
	require.Zero(t, h.tiering().LookupsTimedOut, "answered before any deadline: the clock never moved")
	h.store(&messages.ReqContext{RequestID: "still-during"}, 200)
	h.idle()
	h.quiet()

	require.NoError(t, s.Restart(h.ctx))
	h.clock.Advance(obj.DefaultProbeMin) // the probe's timer
	h.awaitObjHealth(true)
	h.clock.Advance(tiering.DefaultNegativeTTL) // the outage's MISS answers expire
	require.Equal(t, messages.Retry, h.lookup(req, ks, true)[0])
	h.idle()
	require.Equal(t, statuses(len(ks), messages.Hit), h.lookup(req, ks, true), "blocks from before the kill are back")
	h.loadAndVerify(req, before...)
	h.quiet()
	ts = h.tiering()
	require.Equal(t, uint64(len(before)), ts.Promoted["obj"])
	require.True(t, ts.Tiers[0].Healthy)
}

// A corrupt object is found, fails verification on promotion, is deleted
// and becomes a MISS: no livelock.
func TestObjCorruptObjectIsDeletedNotServed(t *testing.T) {
	s := objtest.Start(t, objBucket)
	h := open(t, 4, withObj(s, func(tc *config.TierConfig) { tc.Workers = 1 }))
	h.store(&messages.ReqContext{RequestID: "w"}, 7)
	h.idle()
	h.evictAll(4)

	raw, err := s.Client(objBucket)
	require.NoError(t, err)
	defer raw.Close()
	name := "node/" + blockfmt.RelPath(key(7))
	objtest.Corrupt(t, h.ctx, raw, objBucket, name, func(data []byte) { data[blockfmt.HeaderSize+100] ^= 0x01 })

	req := &messages.ReqContext{RequestID: "r"}
	require.Equal(t, messages.Retry, h.lookup(req, keys(7), true)[0])
	h.idle()
	for range 3 {
		require.Equal(t, messages.Miss, h.lookup(req, keys(7), true)[0], "no livelock on a bad copy")
	}
	ts := h.tiering()
	require.Equal(t, uint64(1), ts.PromotionsFailed["obj"])
	require.Equal(t, uint64(1), ts.Tiers[0].Invalid)
	require.Zero(t, ts.Promoted["obj"])
	// One worker: a lookup asked now runs after the delete.
	r, err := actors.Ask(h.ctx, h.node.system, h.objPID(), &tiermsg.Lookup{Keys: keys(7)})
	require.NoError(t, err)
	require.Equal(t, []bool{false}, r.(*tiermsg.LookupResult).Found)
	_, err = raw.Raw().StatObject(h.ctx, objBucket, name, minio.StatObjectOptions{})
	require.Equal(t, http.StatusNotFound, minio.ToErrorResponse(err).StatusCode, "the bad copy is deleted")
	h.quiet()
}

// An endpoint nobody listens on: the node opens, the tier starts unhealthy
// and every lookup is a MISS a step later.
func TestObjEndpointDownAtStart(t *testing.T) {
	s := objtest.Start(t, objBucket)
	s.Kill()
	h := open(t, 4, withObj(s))
	h.awaitObjHealth(false)
	req := &messages.ReqContext{RequestID: "r"}
	require.Equal(t, messages.Retry, h.lookup(req, keys(1), true)[0])
	h.idle()
	require.Equal(t, messages.Miss, h.lookup(req, keys(1), true)[0])
	h.store(&messages.ReqContext{RequestID: "w"}, 1)
	h.idle()
	require.Equal(t, uint64(1), h.tiering().CascadeDropped["obj"])
	h.quiet()
}

func TestObjMetrics(t *testing.T) {
	s := objtest.Start(t, objBucket)
	h := open(t, 4, withObj(s))
	h.store(&messages.ReqContext{RequestID: "w"}, 1, 2)
	h.idle()
	got := h.metricTotals("tier", "obj")
	require.Equal(t, 2.0, got["kvtier_cascade_written_total"])
	require.Equal(t, 1.0, got["kvtier_tier_healthy"])
}
