package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/obj"
	"github.com/kvtier/kvtier/tiers/obj/objtest"
)

// ObjOptions sizes the obj-tier scenario. With Endpoint empty it starts a
// versitygw (posix backend in a temporary directory under Dir) on loopback
// for the run.
type ObjOptions struct {
	Endpoint   string // host:port of an S3-compatible store; empty: start versitygw
	Bucket     string // created if absent
	AccessKey  string // default: AWS_ACCESS_KEY_ID
	SecretKey  string // default: AWS_SECRET_ACCESS_KEY
	Dir        string // where a started versitygw keeps its objects
	Blocks     int
	BlockBytes int
	Workers    int // the tier's concurrent S3 calls
	Window     int // operations in flight, tier and raw alike
	Timeout    time.Duration
}

// DefaultObjOptions is what `kvtier bench obj` runs with no flags: 256 MiB.
func DefaultObjOptions() ObjOptions {
	return ObjOptions{Bucket: "kvtier-bench", Dir: os.TempDir(), Blocks: 1024, BlockBytes: 256 << 10,
		Workers: 16, Window: 16, Timeout: 10 * time.Minute}
}

// ObjResult is the scenario's report. Raw figures are plain minio-go
// PutObject / GetObject of the same bytes, same server, same run, with the
// same number in flight; tier figures go through the obj tier's actor and
// workers (CRC32C check and header on write, header/key/length/CRC32C
// verify on read).
type ObjResult struct {
	ObjPutGBps float64 `json:"obj_put_GBps"`
	ObjGetGBps float64 `json:"obj_get_GBps"`
	RawPutGBps float64 `json:"raw_put_GBps"`
	RawGetGBps float64 `json:"raw_get_GBps"`
	PutRatio   float64 `json:"put_ratio"` // obj ÷ raw
	GetRatio   float64 `json:"get_ratio"` // obj ÷ raw
	TierLoad
	Server string `json:"server"` // "versitygw (started)" or the endpoint
}

// RunObj measures raw minio-go PUT/GET, then the obj tier, on the same
// bytes and server.
func RunObj(ctx context.Context, o ObjOptions) (res ObjResult, err error) {
	if o.Blocks <= 0 || o.BlockBytes <= 0 || o.Window <= 0 || o.Bucket == "" {
		return ObjResult{}, fmt.Errorf("%w: blocks, block bytes, window and bucket must be set", messages.ErrBadConfig)
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	res = ObjResult{TierLoad: TierLoad{Blocks: o.Blocks, BlockBytes: o.BlockBytes, Workers: o.Workers, Window: o.Window}, Server: o.Endpoint}
	if o.AccessKey == "" {
		o.AccessKey, o.SecretKey = os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	}
	if o.Endpoint == "" {
		stop, err := startVersity(ctx, &o)
		if err != nil {
			return res, err
		}
		defer stop()
		res.Server = "versitygw (started)"
	}
	ep := obj.Endpoint{Endpoint: o.Endpoint, Bucket: o.Bucket, AccessKey: o.AccessKey, SecretKey: o.SecretKey, Conns: o.Window}
	if err := makeBucket(ctx, ep); err != nil {
		return res, err
	}
	src, err := randomBlocks(64, o.BlockBytes)
	if err != nil {
		return res, err
	}
	total := float64(o.Blocks) * float64(o.BlockBytes)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	put, get, err := rawObjIO(ctx, ep, "raw-"+run+"/", src, o)
	if err != nil {
		return res, fmt.Errorf("raw minio-go: %w", err)
	}
	res.RawPutGBps, res.RawGetGBps = total/put.Seconds()/1e9, total/get.Seconds()/1e9
	put, get, err = tierObjIO(ctx, ep, "tier-"+run+"/", src, o)
	if err != nil {
		return res, fmt.Errorf("obj tier: %w", err)
	}
	res.ObjPutGBps, res.ObjGetGBps = total/put.Seconds()/1e9, total/get.Seconds()/1e9
	res.PutRatio, res.GetRatio = res.ObjPutGBps/res.RawPutGBps, res.ObjGetGBps/res.RawGetGBps
	return res, nil
}

func startVersity(ctx context.Context, o *ObjOptions) (stop func(), err error) {
	bin, err := objtest.Binary()
	if err != nil {
		return nil, fmt.Errorf("no --endpoint and %w", err)
	}
	dir, err := os.MkdirTemp(o.Dir, "kvtier-bench-obj-")
	if err != nil {
		return nil, err
	}
	s, err := objtest.LaunchDirect(ctx, bin, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	o.Endpoint, o.AccessKey, o.SecretKey = s.Endpoint, objtest.AccessKey, objtest.SecretKey
	return func() { s.Stop(); os.RemoveAll(dir) }, nil
}

func makeBucket(ctx context.Context, ep obj.Endpoint) error {
	c, err := obj.NewMinio(ep)
	if err != nil {
		return err
	}
	defer c.Close()
	exists, err := c.Raw().BucketExists(ctx, ep.Bucket)
	if err == nil && !exists {
		err = c.Raw().MakeBucket(ctx, ep.Bucket, minio.MakeBucketOptions{})
	}
	if err != nil {
		return fmt.Errorf("bucket %s: %w", ep.Bucket, err)
	}
	return nil
}

// rawObjIO PUTs then GETs the blocks with plain minio-go, Window at a time.
func rawObjIO(ctx context.Context, ep obj.Endpoint, prefix string, src [][]byte, o ObjOptions) (put, get time.Duration, err error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = o.Window
	defer tr.CloseIdleConnections()
	c, err := minio.New(ep.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(ep.AccessKey, ep.SecretKey, ""),
		Transport: tr, Region: "us-east-1"})
	if err != nil {
		return 0, 0, err
	}
	name := func(i int) string { return prefix + strconv.Itoa(i) }
	put, err = parallel(ctx, o, func(i int, _ []byte) error {
		b := src[i%len(src)]
		_, err := c.PutObject(ctx, ep.Bucket, name(i), bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{})
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	get, err = parallel(ctx, o, func(i int, buf []byte) error {
		r, err := c.GetObject(ctx, ep.Bucket, name(i), minio.GetObjectOptions{})
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.ReadFull(r, buf)
		return err
	})
	return put, get, err
}

// parallel runs op for 0..Blocks-1 on Window goroutines, each with its own
// block-sized buffer.
func parallel(ctx context.Context, o ObjOptions, op func(i int, buf []byte) error) (time.Duration, error) {
	next := make(chan int)
	errs := make(chan error, o.Window)
	var wg sync.WaitGroup
	start := time.Now()
	for range o.Window {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, o.BlockBytes)
			for i := range next {
				if err := op(i, buf); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range o.Blocks {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs
	}
	return time.Since(start), err
}

// tierObjIO writes the blocks through the obj tier's actor with Window in
// flight, then reads every one back (verified by the tier).
func tierObjIO(ctx context.Context, ep obj.Endpoint, prefix string, src [][]byte, o ObjOptions) (put, get time.Duration, err error) {
	tier, err := obj.Open(obj.Config{Endpoint: ep, Prefix: prefix, MaxBlockBytes: o.BlockBytes, Workers: o.Workers,
		Queue: 4 * o.Window, Log: zerolog.Nop()})
	if err != nil {
		return 0, 0, err
	}
	return driveTier(ctx, tierDrive{name: "obj", props: tier.Props(nil), close: tier.Close, blockBytes: o.BlockBytes,
		blocks: o.Blocks, window: o.Window}, src)
}
