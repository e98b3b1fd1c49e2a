package objtest

import (
	"bytes"
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/minio/minio-go/v7"

	"github.com/kvtier/kvtier/internal/testutil/needbin"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/obj"
)

// TB is the part of testing.TB these helpers use (needbin's).
type TB = needbin.TB

// Need returns the versitygw binary (Binary). Without it the test is
// skipped, or fails when CI is "true": CI must run these tests
// (needbin.Need).
func Need(t TB) string {
	t.Helper()
	return needbin.Need(t, Binary)
}

// Start launches a server over a temporary directory with bucket created,
// stopped when the test ends. Without the binary the test is skipped, or
// fails when CI is "true" (Need).
func Start(t TB, bucket string) *Server {
	t.Helper()
	bin := Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Launch(ctx, bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if err := s.MakeBucket(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	return s
}

// Corrupt reads the object name in bucket through c, applies flip to its
// bytes and writes it back: a copy damaged at rest.
func Corrupt(t TB, ctx context.Context, c *obj.Minio, bucket, name string, flip func(data []byte)) {
	t.Helper()
	o, err := c.Raw().GetObject(ctx, bucket, name, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_, err = buf.ReadFrom(o)
	if cerr := o.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	flip(data)
	if _, err := c.Raw().PutObject(ctx, bucket, name, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
}

// AwaitHealth waits until the obj tier actor pid reports healthy (or
// unhealthy), failing the test if ctx ends first.
func AwaitHealth(t TB, ctx context.Context, root *actor.RootContext, pid *actor.PID, healthy bool) {
	t.Helper()
	r := messages.NewReply[struct{}]()
	root.Send(pid, &obj.AwaitHealth{Healthy: healthy, Reply: r})
	select {
	case <-r.C():
	case <-ctx.Done():
		t.Fatalf("obj tier never became healthy=%v", healthy)
	}
}
