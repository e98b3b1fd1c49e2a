package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/internal/testutil/testleak"
	"github.com/kvtier/kvtier/messages"
)

// Open fails late (a secondary tier whose root is a file), after the pool,
// the engine endpoint and the events publisher were opened: they close in
// reverse, the error comes back (no panic), and nothing is left behind.
func TestOpenFailingLateClosesWhatItOpened(t *testing.T) {
	before := goleak.IgnoreCurrent()
	dir := t.TempDir()
	notADir := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(notADir, []byte("x"), 0o600))
	pool := filepath.Join(dir, "pool")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node, err := Open(ctx, config.Config{PoolBytes: 8 * testBlock, BlockBytes: testBlock, PoolPath: pool,
		EngineListen:   "ipc://" + filepath.Join(dir, "engine.sock"),
		Events:         config.EventsConfig{Endpoint: "tcp://127.0.0.1:0"},
		SecondaryTiers: []config.TierConfig{{Kind: "fs", Root: notADir}}})
	require.Error(t, err)
	require.Nil(t, node)
	_, statErr := os.Stat(pool)
	require.ErrorIs(t, statErr, os.ErrNotExist, "the pool file is removed")
	goleak.VerifyNone(t, before, testleak.ZMQPubWriter)
}

// Every eviction policy the CPU tier has is a valid config; any other name
// is refused with the list.
func TestPolicyNames(t *testing.T) {
	for _, p := range []string{"lru", "arc", "prefix"} {
		require.NoError(t, config.Config{Policy: p}.WithDefaults().Validate(), p)
	}
	err := config.Config{Policy: "fifo"}.WithDefaults().Validate()
	require.ErrorIs(t, err, messages.ErrBadConfig)
	require.ErrorContains(t, err, "prefix")
}
