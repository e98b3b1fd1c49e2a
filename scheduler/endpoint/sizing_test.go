package endpoint

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
)

// A daemon sizing its slots answers every hello SIZING; a hello that
// declares no block size leaves it waiting, the first that declares one
// ends the wait with that size rounded up to a page, and the socket is gone
// afterwards so the node can bind the address.
func TestAwaitBlockBytesTakesTheFirstDeclaredSize(t *testing.T) {
	for _, transport := range []string{"unix", "ipc"} {
		t.Run(transport, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// NB: a short directory: the socket is bound under a longer
			// temporary name first, and a unix socket path has 108 bytes.
			dir, err := os.MkdirTemp("", "kvs")
			require.NoError(t, err)
			defer os.RemoveAll(dir)
			addr := transport + "://" + filepath.Join(dir, "e.sock")
			type result struct {
				n   int
				err error
			}
			done := make(chan result, 1)
			ready := make(chan struct{})
			go func() {
				close(ready)
				n, err := AwaitBlockBytes(ctx, ListenOptions{Addr: addr, GID: -1}, zerolog.Nop())
				done <- result{n, err}
			}()
			<-ready
			dial := func(blockBytes int) error {
				// NB: the listener may not be bound yet; a refused dial is tried again.
				for {
					c, err := client.Dial(ctx, addr, client.Options{Name: "sizer", BlockBytes: blockBytes})
					if c != nil {
						_ = c.Close(ctx)
					}
					if err == nil || errors.Is(err, messages.ErrSizing) || ctx.Err() != nil {
						return err
					}
					select { // NB: polling a socket being bound; nothing to wait on
					case r := <-done:
						t.Fatalf("the wait ended before a size was declared: %+v", r)
					case <-ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
			err = dial(0)
			require.ErrorIs(t, err, messages.ErrSizing, "no size declared: still sizing")
			select {
			case r := <-done:
				t.Fatalf("the wait ended on a hello that declared nothing: %+v", r)
			default:
			}
			// NB: the socket closes right after its answer; over ZeroMQ the
			// answer may go with it (an engine's hello then times out, and
			// it dials again all the same).
			dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := client.Dial(dctx, addr, client.Options{Name: "sizer", BlockBytes: 10_000})
			dcancel()
			require.Error(t, err, "no session while sizing")
			require.Nil(t, c)
			if transport == "unix" {
				require.ErrorIs(t, err, messages.ErrSizing, "sized for this engine: say hello again")
			}
			r := <-done
			require.NoError(t, r.err)
			assert.Equal(t, 12_288, r.n, "rounded up to a page")
			lctx, lcancel := context.WithTimeout(ctx, time.Second)
			defer lcancel()
			_, err = client.Dial(lctx, addr, client.Options{Name: "late"})
			assert.Error(t, err, "the sizing socket is closed")
		})
	}
}

func TestAwaitBlockBytesEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := AwaitBlockBytes(ctx, ListenOptions{Addr: "unix://" + filepath.Join(t.TempDir(), "e.sock"), GID: -1}, zerolog.Nop())
	assert.ErrorIs(t, err, context.Canceled)
}
