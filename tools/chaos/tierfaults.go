package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/obj"
)

// Secondary-tier faults: rules for the fs and obj tiers' own fault-injecting
// wrappers (tiers/fs.Faulty, tiers/obj.Faulty) decided by the run's gate,
// and two thin wrappers of ours that flip a bit in what a read returns —
// which the tiers' checksums must catch before anything is committed.
//
// NB: a slow call blocks the tier's I/O worker that made it, never a
// mailbox: the tiers run every call on their workers.

var fsOps = map[fs.Op]string{fs.OpCreate: "create", fs.OpOpen: "open", fs.OpWrite: "write", fs.OpRead: "read",
	fs.OpSync: "sync", fs.OpClose: "close", fs.OpRename: "rename", fs.OpRemove: "remove", fs.OpMkdir: "mkdir",
	fs.OpReadDir: "readdir", fs.OpTruncate: "truncate"}

// fsFailable are the calls an fs-error fault may fail; the others only
// slow down (a failed remove or close is not a fault the tier reports).
var fsFailable = map[fs.Op]bool{fs.OpCreate: true, fs.OpOpen: true, fs.OpWrite: true, fs.OpRead: true,
	fs.OpSync: true, fs.OpRename: true}

// chaosFS is the fs tier's filesystem in a run: the run's disk (disk, full
// now and then) behind fs.Faulty (errors, slowness) behind a bit-flipping
// reader.
func chaosFS(g *gate, disk fs.FS) fs.FS {
	faulty := fs.NewFaulty(disk)
	faulty.Inject(func(op fs.Op, _ string) error {
		kinds := []Kind{supervision.FaultFSSlow}
		if fsFailable[op] {
			kinds = []Kind{supervision.FaultFSError, supervision.FaultFSSlow}
		}
		d := g.decide("fs "+fsOps[op], kinds...)
		switch d.Kind {
		case supervision.FaultFSError:
			if (op == fs.OpWrite || op == fs.OpCreate) && d.Arg%2 == 0 {
				return syscall.ENOSPC
			}
			return syscall.EIO
		case supervision.FaultFSSlow:
			time.Sleep(d.Delay) // a slow device: this I/O worker waits
		}
		return nil
	})
	return corruptFS{FS: faulty, g: g}
}

type corruptFS struct {
	fs.FS
	g *gate
}

func (c corruptFS) Open(name string) (fs.File, error) {
	f, err := c.FS.Open(name)
	if err != nil {
		return nil, err
	}
	return corruptFile{File: f, g: c.g}, nil
}

type corruptFile struct {
	fs.File
	g *gate
}

func (f corruptFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	if n > 0 {
		if d := f.g.decide("fs read-bits", supervision.FaultFSCorrupt); !d.None() {
			flip(p[:n], d.Arg)
		}
	}
	return n, err
}

// flip inverts bit arg mod the bits of p.
func flip(p []byte, arg uint64) {
	bit := arg % uint64(len(p)*8)
	p[bit/8] ^= 1 << (bit % 8)
}

var objOps = map[obj.Op]string{obj.OpPut: "put", obj.OpGet: "get", obj.OpHead: "head", obj.OpRemove: "remove", obj.OpProbe: "probe"}

// chaosObjClient is the obj tier's S3 client in a run: minio-go behind a
// bit-flipping GET body behind obj.Faulty (errors, slowness). Probes only
// slow down, so that a tier made unhealthy by faults can recover.
func chaosObjClient(g *gate, inner obj.Client) obj.Client {
	faulty := obj.NewFaulty(corruptClient{Client: inner, g: g})
	faulty.Inject(func(ctx context.Context, op obj.Op, name string) error {
		kinds := []Kind{supervision.FaultObjError, supervision.FaultObjSlow}
		if op == obj.OpProbe {
			kinds = kinds[1:]
		}
		d := g.decide("obj "+objOps[op], kinds...)
		switch d.Kind {
		case supervision.FaultObjError:
			if d.Arg%2 == 0 {
				return fmt.Errorf("chaos: %s %s: %w", objOps[op], name, syscall.ECONNRESET)
			}
			return minio.ErrorResponse{StatusCode: http.StatusServiceUnavailable, Code: "SlowDown",
				Message: "chaos: injected 503"}
		case supervision.FaultObjSlow:
			t := time.NewTimer(d.Delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	return faulty
}

type corruptClient struct {
	obj.Client
	g *gate
}

func (c corruptClient) Get(ctx context.Context, name string) (io.ReadCloser, int64, error) {
	rc, size, err := c.Client.Get(ctx, name)
	if err != nil || size <= 0 {
		return rc, size, err
	}
	if d := c.g.decide("obj get-bits", supervision.FaultObjCorrupt); !d.None() {
		return &flipReader{ReadCloser: rc, bit: d.Arg % uint64(size*8)}, size, nil
	}
	return rc, size, nil
}

// flipReader inverts one bit of the stream, at bit offset bit.
type flipReader struct {
	io.ReadCloser
	off uint64 // bytes read so far
	bit uint64
}

func (r *flipReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if at := r.bit / 8; at >= r.off && at < r.off+uint64(n) {
		p[at-r.off] ^= 1 << (r.bit % 8)
	}
	r.off += uint64(n)
	return n, err
}
