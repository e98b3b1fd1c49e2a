package node

// The node's secondary tiers: opened (fs: index rebuilt from disk) before
// the actors start, spawned under the guardian as "tier-<name>" beside the
// "tiering" actor, their I/O workers closed after the actors stopped and
// before the pool is unmapped (a worker may be copying into a slot).

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/p2p"
	"github.com/kvtier/kvtier/tiers/tiering"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
)

// openedTier is a secondary tier ready to be spawned.
type openedTier struct {
	name, kind string
	props      func(hub *actor.PID) *actor.Props // hub: the node's event hub, nil when events are off
	close      func(context.Context) error
}

// tiersState is the node's secondary-tier plumbing.
type tiersState struct {
	opened  []openedTier
	tiering *actor.PID // nil without secondary tiers
}

// openTiers opens every configured secondary tier.
func (n *Node) openTiers() error {
	names := config.TierNames(n.cfg.SecondaryTiers)
	fsTiers := 0
	for i, tc := range n.cfg.SecondaryTiers {
		log := n.cfg.Logger.With().Str("actor", "tier-"+names[i]).Logger()
		switch tc.Kind {
		case tiers.KindFS:
			t, err := fs.Open(fs.Config{Name: names[i], Root: tc.Root, Capacity: int64(tc.Capacity), Locality: tc.Locality,
				MaxBlockBytes: n.maxTierBlock(), Fsync: tc.Fsync, Workers: tc.Workers, FS: tc.FS, Layout: tc.Layout, Log: log,
				Residency: n.fsObserver(fsTiers)})
			fsTiers++
			if err != nil {
				_ = n.closeTiers(context.Background())
				return fmt.Errorf("kvtier: secondary tier %s: %w", names[i], err)
			}
			n.tiers.opened = append(n.tiers.opened, openedTier{name: names[i], kind: tc.Kind, props: t.Props, close: t.Close})
		case tiers.KindObj:
			t, err := openObjTier(tc, names[i], n.cfg, log)
			if err != nil {
				_ = n.closeTiers(context.Background())
				return fmt.Errorf("kvtier: secondary tier %s: %w", names[i], err)
			}
			n.tiers.opened = append(n.tiers.opened, t)
		}
	}
	return nil
}

// tierProps builds one secondary tier's actor.
func (n *Node) tierProps(w wiring) *actor.Props {
	for _, t := range n.tiers.opened {
		if t.name == w.self.instance {
			return t.props(w.to("events"))
		}
	}
	w.fail(errors.New("secondary tier planned but not opened"))
	return nil
}

// tieringProps builds the tiering actor over the secondary tiers, in config
// order, then the P2P tier: a local copy (fs, obj) is preferred to a peer's.
func (n *Node) tieringProps(w wiring) *actor.Props {
	var ts []tiering.Tier
	for _, t := range n.tiers.opened {
		ts = append(ts, tiering.Tier{Name: t.name, Kind: t.kind, Ref: fx.RefOf(w.to("tier-" + t.name))})
	}
	if pid := w.to("p2p"); pid != nil {
		ts = append(ts, tiering.Tier{Name: n.peers.tierName(n.cfg.Peers), Kind: p2p.Kind, Ref: fx.RefOf(pid), Batched: true, NoCascade: true})
	}
	return tiering.Props(tiering.Config{
		CPU: fx.RefOf(w.to("cpu")), Tiers: ts, Slot: n.pool.Slot, Clock: n.cfg.Clock,
		LookupDeadline: n.cfg.SecondaryLookupDeadline, CascadeQueue: n.cfg.CascadeQueue,
		Log: n.cfg.Logger.With().Str("actor", "tiering").Logger(),
	})
}

// closeTiers stops every tier's I/O workers, waiting for running I/O until
// ctx ends; an error means slot memory may still be touched.
func (n *Node) closeTiers(ctx context.Context) error {
	var errs []error
	for _, t := range n.tiers.opened {
		if err := t.close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("tier %s: %w", t.name, err))
		}
	}
	n.tiers.opened = nil
	return errors.Join(errs...)
}

// ErrNoSecondaryTiers: the node has no secondary tier configured.
var ErrNoSecondaryTiers = fmt.Errorf("%w: no secondary tiers configured", messages.ErrBadConfig)

// TieringIdle waits until the tiering actor has no secondary lookup,
// promotion or cascade in flight, or ctx ends. The engine API never needs
// it; simulators and tests use it to settle a node between steps. Without
// secondary tiers it returns at once.
func (n *Node) TieringIdle(ctx context.Context) error {
	if n.tiers.tiering == nil {
		return nil
	}
	_, err := askTiering[struct{}](ctx, n, func(r messages.Reply[struct{}]) any { return &tieringmsg.Idle{Reply: r} })
	return err
}

// TieringStats returns the tiering actor's counters and each secondary
// tier's (ErrNoSecondaryTiers without any).
func (n *Node) TieringStats(ctx context.Context) (messages.TieringStats, error) {
	if n.tiers.tiering == nil {
		return messages.TieringStats{}, ErrNoSecondaryTiers
	}
	return askTiering[messages.TieringStats](ctx, n, func(r messages.Reply[messages.TieringStats]) any {
		return &tieringmsg.GetStats{Reply: r}
	})
}

func askTiering[T any](ctx context.Context, n *Node, build func(messages.Reply[T]) any) (T, error) {
	return callActor(ctx, n, n.tiers.tiering, "kvtier tiering", build)
}
