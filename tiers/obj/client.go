package obj

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
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
	Endpoint string // host:port
	Bucket   string
	Region   string // default "us-east-1" (no bucket-location round trip)
	Secure   bool   // https
	// AccessKey and SecretKey are static keys; both empty: the credential
	// chain (Credentials).
	AccessKey string
	SecretKey string
	// Conns bounds idle connections kept to the endpoint (the I/O workers).
	Conns int
}

// ErrNoBucket: the endpoint answers but the bucket does not exist.
var ErrNoBucket = errors.New("kvtier obj: bucket does not exist")

// ErrAccessDenied: the endpoint refuses the credentials: a 401 or 403 (an
// unknown key, a wrong secret, no permission) or a session token it does
// not accept (400 InvalidToken, ExpiredToken).
var ErrAccessDenied = errors.New("kvtier obj: access denied")

// credentialCodes are the S3 error codes that refuse the credentials
// whatever their HTTP status (S3 answers a bad session token 400).
var credentialCodes = map[string]bool{
	"AccessDenied": true, "InvalidAccessKeyId": true, "SignatureDoesNotMatch": true,
	"InvalidToken": true, "ExpiredToken": true, "TokenRefreshRequired": true,
}

// Credentials is where a client's keys come from: ep's static keys when it
// has any, else the chain every AWS SDK walks, first to answer wins:
//
//  1. the environment: AWS_ACCESS_KEY_ID (or AWS_ACCESS_KEY),
//     AWS_SECRET_ACCESS_KEY (or AWS_SECRET_KEY), AWS_SESSION_TOKEN;
//  2. the shared credentials file: AWS_SHARED_CREDENTIALS_FILE (default
//     ~/.aws/credentials, merged over AWS_CONFIG_FILE or ~/.aws/config),
//     profile AWS_PROFILE (default "default"), aws_session_token honoured
//     (and the profile's credential_process or SSO role);
//  3. IAM: a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE and
//     AWS_ROLE_ARN, as EKS's IRSA sets them) exchanged at STS
//     (AssumeRoleWithWebIdentity; AWS_REGION's endpoint, or
//     AWS_ENDPOINT_URL_STS), else the container credentials endpoint
//     (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI: ECS, EKS Pod
//     Identity), else the instance metadata service (IMDSv2 then v1;
//     AWS_EC2_METADATA_SERVICE_ENDPOINT, or left out of the chain when
//     AWS_EC2_METADATA_DISABLED is "true").
//
// The providers are minio-go's. Temporary credentials (STS, IMDS, a
// process) carry their expiry and are fetched again before it, on the
// request that finds them stale; none is read once and kept. With none
// found, requests go unsigned (and an endpoint that wants keys answers
// ErrAccessDenied).
func Credentials(ep Endpoint) *credentials.Credentials {
	if ep.AccessKey != "" || ep.SecretKey != "" {
		return credentials.NewStaticV4(ep.AccessKey, ep.SecretKey, "")
	}
	return credentials.NewChainCredentials(chainProviders())
}

// chainProviders is Credentials' chain. minio-go's IAM provider picks web
// identity, container or instance metadata from the environment at each
// fetch; its one endpoint override is set here from the variable the AWS
// SDKs read for the service the environment points it at.
func chainProviders() []credentials.Provider {
	ps := []credentials.Provider{&credentials.EnvAWS{}, &credentials.FileAWSCredentials{}}
	switch {
	case os.Getenv("AWS_WEB_IDENTITY_TOKEN_FILE") != "":
		ps = append(ps, &credentials.IAM{Endpoint: os.Getenv("AWS_ENDPOINT_URL_STS")})
	case os.Getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") != "", os.Getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI") != "":
		ps = append(ps, &credentials.IAM{})
	case os.Getenv("AWS_EC2_METADATA_DISABLED") != "true":
		ps = append(ps, &credentials.IAM{Endpoint: os.Getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT")})
	}
	return ps
}

// Minio is Client over minio-go, with its own HTTP transport (closed by
// Close) and minio-go's internal retries off: the tier retries, by timer.
type Minio struct {
	ep        Endpoint
	client    *minio.Client
	core      *minio.Core
	transport *http.Transport
}

// NewMinio makes a client; it does no I/O (credentials are fetched by the
// first request, see Credentials).
func NewMinio(ep Endpoint) (*Minio, error) {
	if ep.Region == "" {
		ep.Region = "us-east-1"
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(ep.Conns, 2)
	tr.IdleConnTimeout = 90 * time.Second
	tr.DialContext = (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	c, err := minio.New(ep.Endpoint, &minio.Options{
		Creds:      Credentials(ep),
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
// NoSuchKey) also matches messages.ErrNotFound, a missing bucket ErrNoBucket,
// refused credentials ErrAccessDenied.
func wrap(op, name string, err error) error {
	if err == nil {
		return nil
	}
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == minio.NoSuchBucket:
		return fmt.Errorf("obj %s %s: %w: %w", op, name, ErrNoBucket, err)
	case resp.StatusCode == http.StatusUnauthorized, resp.StatusCode == http.StatusForbidden, credentialCodes[resp.Code]:
		return fmt.Errorf("obj %s %s: %w: %w", op, name, ErrAccessDenied, err)
	case resp.StatusCode == http.StatusNotFound, resp.Code == minio.NoSuchKey:
		return fmt.Errorf("obj %s %s: %w: %w", op, name, messages.ErrNotFound, err)
	}
	return fmt.Errorf("obj %s %s: %w", op, name, err)
}
