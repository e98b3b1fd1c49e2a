package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/internal/bench"
)

func newBenchObjCmd() *cobra.Command {
	o := bench.DefaultObjOptions()
	cmd := benchCommand(&cobra.Command{
		Use:   "obj",
		Short: "obj tier block PUT/GET throughput vs plain minio-go PutObject/GetObject of the same bytes, same server, same run",
		Long: `Without --endpoint it starts versitygw (found on PATH or in $(go env GOPATH)/bin)
on 127.0.0.1 with a posix backend in a temporary directory under --dir.`,
	}, func(ctx context.Context) (bench.ObjResult, error) { return bench.RunObj(ctx, o) }, func(r bench.ObjResult) {
		fmt.Printf("%d blocks of %d bytes against %s (%d workers, %d in flight)\n", r.Blocks, r.BlockBytes, r.Server, r.Workers, r.Window)
		fmt.Printf("put: obj tier %.2f GB/s, raw minio-go %.2f GB/s → %.2f×\n", r.ObjPutGBps, r.RawPutGBps, r.PutRatio)
		fmt.Printf("get: obj tier %.2f GB/s, raw minio-go %.2f GB/s → %.2f×\n", r.ObjGetGBps, r.RawGetGBps, r.GetRatio)
	})
	f := cmd.Flags()
	f.StringVar(&o.Endpoint, "endpoint", "", "S3-compatible endpoint HOST:PORT (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY); empty: start versitygw")
	f.StringVar(&o.Bucket, "bucket", o.Bucket, "bucket (created if absent)")
	f.StringVar(&o.Dir, "dir", o.Dir, "where a started versitygw keeps its objects")
	f.IntVar(&o.Blocks, "blocks", o.Blocks, "blocks written and read")
	f.IntVar(&o.BlockBytes, "block-bytes", o.BlockBytes, "bytes per block")
	f.IntVar(&o.Workers, "workers", o.Workers, "obj tier concurrent S3 calls")
	f.IntVar(&o.Window, "window", o.Window, "operations in flight (tier and raw)")
	return cmd
}
