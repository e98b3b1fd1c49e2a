package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/p2p"
)

// The checks a run makes once its engines stopped (the in-run ones —
// hit-loadable, no-wrong-bytes — are made by the engine as it goes).

// harnessCallTimeout bounds each call the checks make; faults are off by
// then, so a call that takes longer is itself a violation.
const harnessCallTimeout = 5 * time.Second

// quietState lists what keeps a node from being quiet, by invariant.
func quietState(ctx context.Context, n *nodeUnderTest) (map[string][]string, messages.Stats, messages.TieringStats, error) {
	out := map[string][]string{}
	add := func(inv, format string, a ...any) { out[inv] = append(out[inv], fmt.Sprintf(format, a...)) }
	if p := n.inj.Pending(); p > 0 {
		add(invLeak, "%d delayed or held messages still on their way", p)
	}
	cctx, cancel := context.WithTimeout(ctx, harnessCallTimeout)
	defer cancel()
	pending, err := n.mgr.HasPendingWork(cctx)
	if err != nil {
		return nil, messages.Stats{}, messages.TieringStats{}, fmt.Errorf("HasPendingWork: %w", err)
	}
	if pending {
		add(invLeak, "HasPendingWork is true")
	}
	st, err := n.mgr.Stats(cctx)
	if err != nil {
		return nil, messages.Stats{}, messages.TieringStats{}, fmt.Errorf("stats: %w", err)
	}
	for _, c := range []struct {
		what string
		n    int
	}{{"slots pinned", st.Pinned}, {"slots leased", st.Leased}, {"leases", st.Leases},
		{"slots write-pending", st.WritePending}, {"engine jobs in flight", st.JobsInFlight},
		{"requests with state at the bridge", st.Requests}} {
		if c.n != 0 {
			add(invLeak, "%d %s", c.n, c.what)
		}
	}
	ts, err := n.node.TieringStats(cctx)
	if err != nil {
		return nil, st, ts, fmt.Errorf("TieringStats: %w", err)
	}
	if ts.InFlightLookups+ts.InFlightPromotions+ts.InFlightCascades > 0 {
		add(invTieringIdle, "tiering in flight: %d lookups, %d promotions, %d cascades",
			ts.InFlightLookups, ts.InFlightPromotions, ts.InFlightCascades)
	}
	for _, t := range ts.Tiers {
		switch {
		case t.InFlight > 0 && t.Kind == p2p.Kind:
			// NB: the P2P tier's in-flight count is its PeerLookups and
			// PeerFetches not answered yet by their sessions.
			add(invPeerRounds, "P2P tier %s has %d PeerLookup/PeerFetch unanswered", t.Name, t.InFlight)
		case t.InFlight > 0:
			add(invTieringIdle, "tier %s has %d I/O operations in flight", t.Name, t.InFlight)
		}
	}
	return out, st, ts, nil
}

// checkQuiet waits until the node is quiet — every lease expired or
// released, every job completed or reaped, every tier idle — or the quiet
// timeout passes, and reports what is left as leaked.
func checkQuiet(ctx context.Context, rs *runState, n *nodeUnderTest) {
	timeout := rs.opts.QuietTimeout
	if timeout <= 0 {
		timeout = rs.nodeCfg.LeaseTTL + 10*time.Second
	}
	deadline := time.Now().Add(timeout)
	for backoff := time.Millisecond; ; backoff = min(2*backoff, 50*time.Millisecond) {
		left, st, ts, err := quietState(ctx, n)
		if err != nil {
			rs.violate(n, invDeadline, "a check's call went unanswered: %v", err)
			return
		}
		n.final, n.tiering = st, ts
		if len(left) == 0 {
			rs.pass(invLeak)
			rs.pass(invTieringIdle)
			if n.node.PeerAddr() != "" {
				rs.pass(invPeerRounds)
			}
			return
		}
		if time.Now().After(deadline) {
			for _, inv := range []string{invLeak, invTieringIdle, invPeerRounds} {
				if len(left[inv]) > 0 {
					rs.violate(n, inv, "not quiet %v after the run: %s", timeout, strings.Join(left[inv], "; "))
				} else {
					rs.pass(inv)
				}
			}
			return
		}
		// NB: the node offers no "quiet" notification; poll with backoff.
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
	}
}

// checkDisk checks the node's fs tier absorbed the run's full disk: every
// write the disk refused (ENOSPC) was counted by the tier, as a full write
// or (a segment's seal) a failed chore, and each of them but the chores as
// a shed cascade by the tiering actor — none lost silently —
// no torn temporary file is left, what the root holds is what the tier
// accounts (accounts), and once the disk had room again the blocks it took
// were stored. Run after checkQuiet (its stats).
func checkDisk(rs *runState, n *nodeUnderTest) {
	var problems []string
	refused, fsStats := n.disk.refused.Load(), fsTierStats(n.tiering)
	chores := fsStats.ChoresFull // NB: seals refused for lack of room, not every failed chore
	if fsStats.WritesFull+chores < refused {
		problems = append(problems, fmt.Sprintf("the disk refused %d writes, the fs tier counted %d full writes and %d full chores",
			refused, fsStats.WritesFull, chores))
	}
	if shed := n.tiering.CascadeDropped[fsStats.Name]; shed+chores < refused {
		problems = append(problems, fmt.Sprintf("the disk refused %d writes, the tiering actor counted %d cascades shed (and the tier %d full chores)",
			refused, shed, chores))
	}
	switch disk, err := scanRoot(n.fsRoot); {
	case err != nil:
		problems = append(problems, fmt.Sprintf("scan of %s: %v", n.fsRoot, err))
	case len(disk.torn) > 0:
		problems = append(problems, fmt.Sprintf("%d temporary block files left behind: %s", len(disk.torn), sample(disk.torn)))
	default:
		if p := accounts(rs.opts.segments(), disk, fsStats, int64(rs.nodeCfg.BlockBytes)); p != "" {
			problems = append(problems, p)
		}
	}
	if p := recovered(rs, n); p != "" {
		problems = append(problems, p)
	}
	if len(problems) > 0 {
		rs.violate(n, invDiskFull, "%s", strings.Join(problems, "; "))
		return
	}
	rs.pass(invDiskFull)
}

// accounts compares what an fs tier's root holds with what the tier
// accounts (its Blocks and Bytes), once the tier is quiet; "" when they
// agree. A refused write must leak neither a file nor room.
//
// Files layout: exactly — the tier indexes every block file, and its bytes
// are the files' sizes.
//
// Segments layout: the tier accounts whole segments, a failed record's room
// included (dead until its segment goes), and a segment's room at least as
// the bytes its file takes once sealed (tiers/fs seglog.go), so exact counts
// cannot be had from the files. What holds: the room the segment files take
// (roomOf, a hole taking none) and the block files read through is at most
// what the tier accounts — a segment file it forgot, or one it stopped
// accounting before its removal, breaks it — and at least its indexed
// blocks' bytes; and it accounts no more than its capacity.
func accounts(segments bool, disk onDisk, st messages.SecondaryStats, blockBytes int64) string {
	if !segments {
		if disk.blocks != st.Blocks || disk.bytes != st.Bytes {
			return fmt.Sprintf("the fs tier indexes %d blocks of %d bytes, its root holds %d of %d bytes",
				st.Blocks, st.Bytes, disk.blocks, disk.bytes)
		}
		return ""
	}
	taken := disk.bytes + disk.segRoom
	switch {
	case taken > st.Bytes:
		return fmt.Sprintf("the fs tier accounts %d bytes, its root takes %d (%d segment files, %d block files)",
			st.Bytes, taken, disk.segments, disk.blocks)
	case int64(st.Blocks)*blockBytes > taken:
		return fmt.Sprintf("the fs tier indexes %d blocks of %d bytes, its root takes only %d (%d segment files, %d block files)",
			st.Blocks, blockBytes, taken, disk.segments, disk.blocks)
	case st.Capacity > 0 && st.Bytes > st.Capacity:
		return fmt.Sprintf("the fs tier accounts %d bytes, over its capacity of %d", st.Bytes, st.Capacity)
	}
	return ""
}

// recovered checks the node's fs tier stored blocks once the disk had room
// again: a violation when the disk took diskRecoveryWrites blocks since its
// last window and none was published (fullFS.count says what that is in
// each layout); a note when it could not tell (the window ended too close
// to the engines' stop, or no new block reached the disk since).
func recovered(rs *runState, n *nodeUnderTest) string {
	windows, lastEnd := rs.disk.ended()
	if windows == 0 {
		return ""
	}
	left := rs.stopped.Sub(lastEnd).Round(time.Millisecond)
	created, stored := n.disk.sinceRoom()
	switch {
	case left < diskRecovery:
		rs.note("%s: the disk was full until %v before the engines stopped: too late to expect a write after it", n.name, left)
	case stored > 0:
	case created >= diskRecoveryWrites:
		return fmt.Sprintf("the disk took %d blocks since it had room again (%v before the engines stopped), none was stored", created, left)
	default:
		rs.note("%s: %d blocks reached the disk in the %v after its last full window: too few to tell it stores again", n.name, created, left)
	}
	return ""
}

// fsTierStats are the fs tier's figures among the node's secondary tiers.
func fsTierStats(ts messages.TieringStats) messages.SecondaryStats {
	for _, t := range ts.Tiers {
		if t.Kind == tiers.KindFS {
			return t
		}
	}
	return messages.SecondaryStats{}
}

// checkEvents replays the node's event streams — what TakeEvents returned
// and what the node published — and compares each with the blocks the CPU
// tier holds.
func checkEvents(ctx context.Context, rs *runState, n *nodeUnderTest) {
	cctx, cancel := context.WithTimeout(ctx, harnessCallTimeout)
	defer cancel()
	for { // what was announced after the engines' last drain (late promotions)
		evs, err := n.mgr.TakeEvents(cctx)
		if err != nil {
			rs.violate(n, invDeadline, "TakeEvents after the run: %v", err)
			return
		}
		if len(evs) == 0 {
			break
		}
		for i := range evs {
			n.take.apply(&evs[i])
		}
	}
	inv, err := n.node.Inventory(cctx)
	if err != nil {
		rs.violate(n, invDeadline, "Inventory after the run: %v", err)
		return
	}
	held := inv[messages.MediumCPU]
	switch phantom, unannounced := n.take.diff(held); {
	case len(phantom)+len(unannounced) > 0:
		rs.violate(n, invEvents, "TakeEvents replay: %d blocks announced but not held %s, %d held but never announced %s; history:%s%s",
			len(phantom), sample(phantom), len(unannounced), sample(unannounced), n.take.History(phantom), n.take.History(unannounced))
	default:
		rs.pass(invEvents)
	}
	if n.pub == nil {
		rs.skip(invPublished, "events off")
		return
	}
	next, err := n.node.FlushEvents(cctx)
	if err != nil {
		rs.violate(n, invDeadline, "FlushEvents after the run: %v", err)
		return
	}
	if err := n.pub.waitFor(next, 10*time.Second); err != nil {
		rs.violate(n, invPublished, "%v", err)
		return
	}
	if m := n.pub.missed.Load(); m > 0 {
		rs.violate(n, invPublished, "%d batches lost (neither received nor replayable)", m)
	}
	if phantom, unannounced := n.pub.model.diff(held); len(phantom)+len(unannounced) > 0 {
		rs.violate(n, invPublished, "replay: %d blocks announced but not held %s, %d held but never announced %s; history:%s%s; TakeEvents history:%s%s",
			len(phantom), sample(phantom), len(unannounced), sample(unannounced), n.pub.model.History(phantom),
			n.pub.model.History(unannounced), n.take.History(phantom), n.take.History(unannounced))
	}
	rs.pass(invPublished)
}

// checkCommitted scrubs the node's CPU tier: every resident block must
// still match the CRC32C taken when it was committed. A block committed
// with flipped bits (a corrupt peer transfer, fs read or S3 GET that a
// checksum let through) fails here even if no engine loaded it. Run after
// checkEvents: a failed block is dropped (and announced).
func checkCommitted(ctx context.Context, rs *runState, n *nodeUnderTest) {
	cctx, cancel := context.WithTimeout(ctx, 4*harnessCallTimeout)
	defer cancel()
	inv, err := n.node.Inventory(cctx)
	if err != nil {
		rs.violate(n, invDeadline, "Inventory after the run: %v", err)
		return
	}
	var bad []string
	for _, k := range inv[messages.MediumCPU] {
		switch err := n.node.VerifyBlock(cctx, k); {
		case err == nil, errors.Is(err, messages.ErrUnknownKey):
		case errors.Is(err, messages.ErrChecksum):
			bad = append(bad, fmt.Sprintf("%x", k.Hash))
		default:
			rs.violate(n, invDeadline, "VerifyBlock after the run: %v", err)
			return
		}
	}
	if len(bad) > 0 {
		rs.violate(n, invCommitted, "%d resident blocks no longer match their commit checksum: %s", len(bad), sample(bad))
		return
	}
	rs.pass(invCommitted)
}

// checkPeers checks every node of a scenario with peers is back in touch
// with every other — after cuts and kills, sessions redial — and keeps
// each node's peer counters for the report.
func checkPeers(ctx context.Context, rs *runState, nodes []*nodeUnderTest) {
	if len(nodes) < 2 || nodes[0].node.PeerAddr() == "" {
		for _, inv := range peerInvariants {
			rs.skip(inv, "no peers in this scenario")
		}
		return
	}
	for _, n := range nodes {
		var others []string
		for _, o := range nodes {
			if o != n {
				others = append(others, o.name)
			}
		}
		// NB: a session redials with backoff up to peer.DefaultRetryMax.
		wctx, cancel := context.WithTimeout(ctx, 3*peer.DefaultRetryMax)
		err := n.node.WaitPeers(wctx, others...)
		cancel()
		if err != nil {
			rs.violate(n, invPeersBack, "no ready session to every peer %v after the run: %v", others, err)
		} else {
			rs.pass(invPeersBack)
		}
	}
	// Stats once every node's sessions are back: a node serves a peer (its
	// inbound session) once that peer's outbound session is ready, which the
	// loop above waited for node by node.
	for _, n := range nodes {
		cctx, cancel := context.WithTimeout(ctx, harnessCallTimeout)
		var err error
		if n.peers, err = n.node.PeerStats(cctx); err != nil {
			rs.violate(n, invDeadline, "PeerStats after the run: %v", err)
		}
		cancel()
		n.tallyPeers(n.peers)
	}
}

func sample(hashes []string) string {
	if len(hashes) > 4 {
		return fmt.Sprintf("%v...", hashes[:4])
	}
	return fmt.Sprint(hashes)
}

// checkDeadlines matches every engine call that timed out with a drop of
// its message on its way to the bridge, injected while the call waited:
// each drop costs exactly one timeout (the message never reached the
// bridge), and a timeout no drop explains is a call the node left
// unanswered.
func checkDeadlines(rs *runState) {
	faults := rs.ledger.Faults()
	drops := map[string][]time.Duration{} // call → when its messages were dropped
	for _, f := range faults {
		if f.Decision.Kind != supervision.FaultDrop {
			continue
		}
		target, typ, _ := strings.Cut(f.Point.Site, " ")
		if actorName(target) == "bridge" {
			if call, ok := engineCallTypes[typ]; ok {
				drops[call] = append(drops[call], f.At)
			}
		}
	}
	rs.mu.Lock()
	timeouts := slices.Clone(rs.timeouts)
	rs.mu.Unlock()
	slices.SortFunc(timeouts, func(a, b timedOut) int { return cmp.Compare(a.sent, b.sent) })
	window := rs.opts.Engine.CallTimeout
	var unexplained []string
	for _, t := range timeouts {
		ds := drops[t.call]
		i := slices.IndexFunc(ds, func(at time.Duration) bool { return at >= t.sent-time.Millisecond && at <= t.sent+window })
		if i >= 0 {
			drops[t.call] = slices.Delete(ds, i, i+1)
			continue
		}
		unexplained = append(unexplained, fmt.Sprintf("%s (%s) sent at %v; faults meanwhile: %s",
			t.call, t.request, t.sent.Round(time.Millisecond), faultsBetween(faults, t.sent, t.sent+window)))
	}
	if len(unexplained) > 0 {
		rs.violate(nil, invDeadline, "%d calls timed out after %v with no drop of their message to explain it: %s",
			len(unexplained), window, strings.Join(unexplained[:min(len(unexplained), 5)], " | "))
	}
	for call, left := range drops {
		if len(left) > 0 {
			rs.note("%d %s messages dropped by a fault with no call timing out for them", len(left), call)
		}
	}
	rs.pass(invDeadline)
}

// faultsBetween summarises the message faults injected in [from, to].
func faultsBetween(faults []supervision.Fault, from, to time.Duration) string {
	var out []string
	for _, f := range faults {
		if f.At >= from && f.At <= to && (strings.HasPrefix(f.Point.Site, "kvtier/") || f.Decision.Kind == supervision.FaultPanic) {
			out = append(out, fmt.Sprintf("%s %s#%d@%v", f.Decision.Kind, f.Point.Site, f.Point.N, f.At.Round(time.Millisecond)))
		}
	}
	if len(out) > 12 {
		out = append(out[:12], fmt.Sprintf("and %d more", len(out)-12))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}
