package events

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/testnet"
)

// silentListener accepts TCP connections and never speaks: a peer that is
// up but hangs every ZMTP handshake.
func silentListener(t *testing.T) string {
	t.Helper()
	ln := testnet.Silent(t, testnet.Listen(t, "tcp", "127.0.0.1:0"))
	return "tcp://" + ln.Addr().String()
}

// Subscribe returns promptly once its context is cancelled, whatever it is
// blocked on: here both its SUB and its replay DEALER hang in the handshake.
func TestSubscribeReturnsPromptlyOnCancelWhateverItWaitsOn(t *testing.T) {
	for _, name := range []string{"live", "replay"} {
		t.Run(name, func(t *testing.T) {
			cfg := SubscriberConfig{Endpoint: silentListener(t), ReplayFrom: -1}
			if name == "replay" {
				cfg.Replay, cfg.ReplayFrom = silentListener(t), 0
			}
			ctx, cancel := context.WithCancel(context.Background())
			returned := make(chan error, 1)
			go func() { returned <- Subscribe(ctx, cfg, func(Delivery) error { return nil }) }()
			select {
			case err := <-returned:
				t.Fatalf("returned before cancel: %v", err)
			case <-time.After(200 * time.Millisecond): // it is blocked: the case under test
			}
			cancel()
			select {
			case err := <-returned:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(5 * time.Second):
				t.Fatal("Subscribe did not return within 5 s of its cancel")
			}
		})
	}
}
