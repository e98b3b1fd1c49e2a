package obj

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kvtier/kvtier/messages"
)

// Client is every S3 call the tier makes, one object at a time. Names are
// full object names (prefix included). A missing object is ErrNotFound.
type Client interface {
	Put(ctx context.Context, name string, body io.Reader, size int64) error
	// Get opens name for reading and returns its size (Content-Length);
	// the caller closes the body.
	Get(ctx context.Context, name string) (io.ReadCloser, int64, error)
	// Head returns name's size.
	Head(ctx context.Context, name string) (int64, error)
	Remove(ctx context.Context, name string) error
	// Probe checks that the endpoint answers and the bucket exists.
	Probe(ctx context.Context) error
	// Close releases the client's idle connections.
	Close()
}

// Endpoint is where and how to reach an S3-compatible store.
type Endpoint struct {
	Endpoint  string // host:port
	Bucket    string
	Region    string // default "us-east-1" (no bucket-location round trip)
	Secure    bool   // https
	AccessKey string
	SecretKey string
	// Conns bounds idle connections kept to the endpoint (the I/O workers).
	Conns int
}

// ErrNoBucket: the endpoint answers but the bucket does not exist.
var ErrNoBucket = errors.New("kvtier obj: bucket does not exist")

// Minio is Client over minio-go, with its own HTTP transport (closed by
// Close) and minio-go's internal retries off: the tier retries, by timer.
type Minio struct {
	ep        Endpoint
	client    *minio.Client
	core      *minio.Core
	transport *http.Transport
}

// NewMinio makes a client; it does no I/O.
func NewMinio(ep Endpoint) (*Minio, error) {
	if ep.Region == "" {
		ep.Region = "us-east-1"
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(ep.Conns, 2)
	tr.IdleConnTimeout = 90 * time.Second
	tr.DialContext = (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	c, err := minio.New(ep.Endpoint, &minio.Options{
		Creds:      credentials.NewStaticV4(ep.AccessKey, ep.SecretKey, ""),
		Secure:     ep.Secure,
		Transport:  tr,
		Region:     ep.Region,
		MaxRetries: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: obj endpoint %q: %w", messages.ErrBadConfig, ep.Endpoint, err)
	}
	return &Minio{ep: ep, client: c, core: &minio.Core{Client: c}, transport: tr}, nil
}

// Raw is the underlying minio-go client (benchmarks compare against it).
func (m *Minio) Raw() *minio.Client { return m.client }

// Put implements Client: one PUT of size bytes (no multipart).
func (m *Minio) Put(ctx context.Context, name string, body io.Reader, size int64) error {
	_, err := m.core.PutObject(ctx, m.ep.Bucket, name, body, size, "", "", minio.PutObjectOptions{
		ContentType: "application/octet-stream", DisableContentSha256: m.ep.Secure})
	return wrap("put", name, err)
}

// Get implements Client.
func (m *Minio) Get(ctx context.Context, name string) (io.ReadCloser, int64, error) {
	body, info, _, err := m.core.GetObject(ctx, m.ep.Bucket, name, minio.GetObjectOptions{})
	if err != nil {
		return nil, 0, wrap("get", name, err)
	}
	return body, info.Size, nil
}

// Head implements Client.
func (m *Minio) Head(ctx context.Context, name string) (int64, error) {
	info, err := m.client.StatObject(ctx, m.ep.Bucket, name, minio.StatObjectOptions{})
	if err != nil {
		return 0, wrap("head", name, err)
	}
	return info.Size, nil
}

// Remove implements Client; a missing object is not an error.
func (m *Minio) Remove(ctx context.Context, name string) error {
	err := wrap("delete", name, m.client.RemoveObject(ctx, m.ep.Bucket, name, minio.RemoveObjectOptions{}))
	if errors.Is(err, messages.ErrNotFound) {
		return nil
	}
	return err
}

// Probe implements Client.
func (m *Minio) Probe(ctx context.Context) error {
	ok, err := m.client.BucketExists(ctx, m.ep.Bucket)
	switch {
	case err != nil:
		return wrap("probe", m.ep.Bucket, err)
	case !ok:
		return fmt.Errorf("%w: %s at %s", ErrNoBucket, m.ep.Bucket, m.ep.Endpoint)
	}
	return nil
}

// Close implements Client.
func (m *Minio) Close() { m.transport.CloseIdleConnections() }

// wrap adds the operation and object to err; a missing object (404,
// NoSuchKey) also matches messages.ErrNotFound, a missing bucket ErrNoBucket.
func wrap(op, name string, err error) error {
	if err == nil {
		return nil
	}
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == minio.NoSuchBucket:
		return fmt.Errorf("obj %s %s: %w: %w", op, name, ErrNoBucket, err)
	case resp.StatusCode == http.StatusNotFound, resp.Code == minio.NoSuchKey:
		return fmt.Errorf("obj %s %s: %w: %w", op, name, messages.ErrNotFound, err)
	}
	return fmt.Errorf("obj %s %s: %w", op, name, err)
}
