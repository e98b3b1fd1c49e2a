package node

import (
	"context"
	"fmt"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// VerifyBlock recomputes a resident block's CRC32C and compares it with the
// checksum taken when it was committed. A mismatch drops the block (it is
// announced as removed and counted in kvtier_checksum_failures_total) and
// returns an error wrapping messages.ErrChecksum; an absent key returns
// messages.ErrUnknownKey. The block is pinned while it is read, off the CPU
// tier's mailbox.
func (n *Node) VerifyBlock(ctx context.Context, key messages.Key) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.CallTimeout)
		defer cancel()
	}
	r, err := actors.Ask(ctx, n.system, n.cpu, &cpumsg.VerifyBlock{Corr: 1, Key: key})
	if err != nil {
		return fmt.Errorf("kvtier: verify %v: %w", key, err)
	}
	ack, ok := r.(*messages.Ack)
	if !ok {
		return fmt.Errorf("kvtier: verify %v: unexpected answer %T", key, r)
	}
	return ack.Err
}
