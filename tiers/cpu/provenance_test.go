package cpu

// The CPU tier retains each ready block's provenance (a reference, no
// copy), answers it with WantProv to lookups and pins, announces what
// CommitSlots.Prov gives, and sends its hub notes of writes begun and
// abandoned that never reach TakeTierEvents.

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func provCtx(blocks int) *messages.ReqContext {
	toks := make([]int32, 4*blocks)
	for i := range toks {
		toks[i] = int32(i)
	}
	return &messages.ReqContext{RequestID: "r", BlockSize: 4, TokenIDs: toks, ParentBlockHash: []byte("P"),
		LoRAID: 3, LoRAName: "l", ExtraKeys: []string{"x"}}
}

func TestStateRetainsProvenanceByReference(t *testing.T) {
	s, _ := newTestState(t, 4)
	call := ks(0, 1, 2)
	ctx := provCtx(3)
	res, err := s.Reserve(j1, call)
	require.NoError(t, err)
	given := &messages.Provenance{BlockSize: 4, TokenIDs: []int32{9, 9, 9, 9}}
	require.NoError(t, s.CommitProv(j1, res.ToStore, true, make([]uint32, 3), ProvSource{
		Ctx: ctx, Place: messages.Place(call, res.ToStore, ctx.ParentBlockHash),
		Prov: []*messages.Provenance{nil, nil, given}}))

	p0 := s.Provenance(tk(0))
	require.NotNil(t, p0)
	assert.Equal(t, []byte("P"), p0.ParentHash)
	assert.Equal(t, []int32{0, 1, 2, 3}, p0.TokenIDs)
	assert.Same(t, &ctx.TokenIDs[0], &p0.TokenIDs[0], "token ids are not copied")
	assert.Equal(t, 3, p0.LoRAID)
	p1 := s.Provenance(tk(1))
	assert.Equal(t, []byte(tk(0).Hash), p1.ParentHash)
	assert.Same(t, &ctx.TokenIDs[4], &p1.TokenIDs[0])
	assert.Same(t, given, s.Provenance(tk(2)), "a given provenance wins over the context")

	assert.Equal(t, s.Provenance(tk(1)), s.ProvenanceOf(ks(1), nil)[0], "no status: every key")
	got := s.ProvenanceOf(ks(0, 3), []messages.LookupStatus{messages.Miss, messages.Miss})
	assert.Equal(t, []*messages.Provenance{nil, nil}, got, "only HITs get one")

	require.True(t, s.Drop(tk(0)))
	assert.Nil(t, s.Provenance(tk(0)), "gone with its block")
	store(t, s, j2, tk(0))
	assert.Nil(t, s.Provenance(tk(0)), "a new store without provenance does not inherit the old one")
}

func TestActorAnswersAndAnnouncesProvenance(t *testing.T) {
	pool, err := OpenPool("", 4, 64)
	require.NoError(t, err)
	t.Cleanup(func() { pool.Close() }) // after the actor stopped
	state, err := NewState(4, "lru", time.Now)
	require.NoError(t, err)
	h := tiertest.Start(t, func(hub *actor.PID) *actor.Props {
		return Props(state, pool, time.Now, zerolog.Nop(), WithEventSink(hub))
	}, tiertest.Options{Timeout: 10 * time.Second, Events: 64})
	ask, next := h.Ask, h.Next

	// A promotion-like commit: provenance given whole.
	job := messages.JobRef{Origin: messages.OriginTier, ID: messages.TieringJobBase + 1}
	r := ask(&cpumsg.ReserveSlots{Job: job, Keys: ks(0, 1)}).(*cpumsg.ReserveResult)
	require.NoError(t, r.Err)
	e := next()
	assert.Equal(t, messages.BlockWriting, e.Kind)
	assert.Equal(t, ks(0, 1), e.Keys)
	given := []*messages.Provenance{{BlockSize: 4, TokenIDs: []int32{1, 2, 3, 4}}, nil}
	require.NoError(t, ask(&cpumsg.CommitSlots{Job: job, Keys: ks(0, 1), OK: true, Checksums: []uint32{0, 0}, Prov: given}).(*messages.Ack).Err)
	e = next()
	assert.Equal(t, messages.BlockStored, e.Kind)
	assert.Equal(t, given, e.Prov)

	// A peer-style lookup gets them back, HITs only; a cascade-style pin too.
	lr := ask(&cpumsg.LookupAndLease{Holder: messages.Holder{Origin: messages.OriginPeer, ID: "round"}, Keys: ks(0, 1, 2),
		TTL: time.Minute, WantProv: true}).(*cpumsg.LookupResult)
	assert.Equal(t, []messages.LookupStatus{messages.Hit, messages.Hit, messages.Miss}, lr.Status)
	assert.Equal(t, []*messages.Provenance{given[0], nil, nil}, lr.Prov)
	plain := ask(&cpumsg.LookupAndLease{Holder: messages.Holder{Origin: messages.OriginPeer, ID: "r2"}, Keys: ks(0), TTL: time.Minute}).(*cpumsg.LookupResult)
	assert.Nil(t, plain.Prov, "only asked for")
	pin := messages.JobRef{Origin: messages.OriginTier, ID: messages.TieringJobBase + 2}
	pr := ask(&cpumsg.LeaseToPin{Job: pin, Keys: ks(0), WantProv: true}).(*cpumsg.PinResult)
	require.NoError(t, pr.Err)
	assert.Equal(t, []*messages.Provenance{given[0]}, pr.Prov)

	// A store that fails: its keys' writes are noted abandoned.
	job3 := messages.JobRef{Origin: messages.OriginEngine, ID: 3}
	require.NoError(t, ask(&cpumsg.ReserveSlots{Job: job3, Keys: ks(2)}).(*cpumsg.ReserveResult).Err)
	assert.Equal(t, messages.BlockWriting, next().Kind)
	require.NoError(t, ask(&cpumsg.CommitSlots{Job: job3, Keys: ks(2), OK: false}).(*messages.Ack).Err)
	e = next()
	assert.Equal(t, messages.BlockWriteAborted, e.Kind)
	assert.Equal(t, ks(2), e.Keys)
	job4 := messages.JobRef{Origin: messages.OriginEngine, ID: 4}
	require.NoError(t, ask(&cpumsg.ReserveSlots{Job: job4, Keys: ks(3)}).(*cpumsg.ReserveResult).Err)
	assert.Equal(t, messages.BlockWriting, next().Kind)
	ask(&cpumsg.ReleaseJob{Job: job4})
	e = next()
	assert.Equal(t, messages.BlockWriteAborted, e.Kind, "a reaped job's writes are abandoned")
	assert.Equal(t, ks(3), e.Keys)

	// Notes never reach the engine's drain.
	te := ask(&cpumsg.TakeTierEvents{}).(*cpumsg.TierEvents)
	require.Len(t, te.Events, 1)
	assert.Equal(t, messages.BlockStored, te.Events[0].Kind)
}

// Resident lists the readable blocks of one namespace, parents before
// their children whatever slots they sit in, with their provenance: a
// write still pending, another namespace's block and a block dropped are
// left out.
func TestResidentListsANamespacesReadyBlocksParentsFirst(t *testing.T) {
	s, _ := newTestState(t, 8)
	ctx := provCtx(3)
	// The chain's tail is committed first, so it sits in an earlier slot.
	call := ks(0, 1, 2)
	for _, part := range [][]messages.Key{call[2:], call[:2]} {
		res, err := s.Reserve(j1, part)
		require.NoError(t, err)
		require.NoError(t, s.CommitProv(j1, res.ToStore, true, make([]uint32, len(part)), ProvSource{
			Ctx: ctx, Place: messages.Place(call, res.ToStore, ctx.ParentBlockHash)}))
	}
	other := messages.Key{Namespace: "other", Hash: "o1"}
	res, err := s.Reserve(j2, []messages.Key{other, tk(3), tk(4)})
	require.NoError(t, err)
	require.NoError(t, s.CommitProv(j2, res.ToStore[:2], true, make([]uint32, 2), ProvSource{}))
	// tk(4) stays write-pending.

	keys, prov := s.Resident(tk(0).Namespace)
	require.Len(t, keys, 4)
	require.Equal(t, call, keys[:3], "the chain, parent first")
	require.Equal(t, tk(3), keys[3], "a block of no known parent starts its own chain")
	require.Equal(t, []int32{4, 5, 6, 7}, prov[1].TokenIDs)
	require.Nil(t, prov[3], "no provenance known")

	require.True(t, s.Drop(tk(1)))
	keys, _ = s.Resident(tk(0).Namespace)
	require.ElementsMatch(t, ks(0, 2, 3), keys, "a dropped block is not resident")
	keys, _ = s.Resident("other")
	require.Equal(t, []messages.Key{other}, keys)
}
