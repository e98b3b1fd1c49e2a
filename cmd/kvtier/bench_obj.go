package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier/tools/bench"
)

// The obj scenario (`kvtier bench obj`): the obj tier vs plain minio-go.
const objShort = "obj tier block PUT/GET throughput vs plain minio-go PutObject/GetObject of the same bytes, same server, same run"

const objLong = `Without --endpoint it starts versitygw (found on PATH or in $(go env GOPATH)/bin)
on 127.0.0.1 with a posix backend in a temporary directory under --dir.`

func printObj(_ bench.ObjOptions, r bench.ObjResult) {
	fmt.Printf("%d blocks of %d bytes against %s (%d workers, %d in flight)\n", r.Blocks, r.BlockBytes, r.Server, r.Workers, r.Window)
	fmt.Printf("put: obj tier %.2f GB/s, raw minio-go %.2f GB/s → %.2f×\n", r.ObjPutGBps, r.RawPutGBps, r.PutRatio)
	fmt.Printf("get: obj tier %.2f GB/s, raw minio-go %.2f GB/s → %.2f×\n", r.ObjGetGBps, r.RawGetGBps, r.GetRatio)
}

func objFlags(f *pflag.FlagSet, o *bench.ObjOptions) {
	f.StringVar(&o.Endpoint, "endpoint", "", "S3-compatible endpoint HOST:PORT (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY); empty: start versitygw")
	f.StringVar(&o.Bucket, "bucket", o.Bucket, "bucket (created if absent)")
	f.StringVar(&o.Dir, "dir", o.Dir, "where a started versitygw keeps its objects")
	blockIOFlags(f, &o.Blocks, &o.BlockBytes)
	f.IntVar(&o.Workers, "workers", o.Workers, "obj tier concurrent S3 calls")
	f.IntVar(&o.Window, "window", o.Window, "operations in flight (tier and raw)")
}
