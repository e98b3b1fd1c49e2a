package obj_test

// Where the obj tier's credentials come from (obj.Credentials), as a pod
// gets them. The S3 side is real in every test: versitygw (objtest) checks
// each request's SigV4 signature against its root keys, so a request it
// accepts was signed with the keys the provider handed the client, and one
// signed with another secret is refused. The shared credentials file and
// the environment are real too. STS and the instance metadata service
// cannot be had here: each is an httptest server answering as AWS
// documents it, reached through the endpoint overrides every AWS SDK reads
// (AWS_ENDPOINT_URL_STS, AWS_EC2_METADATA_SERVICE_ENDPOINT), and it hands
// out versitygw's root keys (with a session token), so the real server
// shows they were used.
//
// NB: t.Setenv: none of these tests runs in parallel.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/obj"
	"github.com/kvtier/kvtier/tiers/obj/objtest"
)

// awsEnv is every variable the chain reads.
var awsEnv = []string{
	"AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SECRET_KEY", "AWS_SESSION_TOKEN",
	"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_PROFILE",
	"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME", "AWS_REGION", "AWS_ENDPOINT_URL_STS",
	"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
	"AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
	"AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_EC2_METADATA_DISABLED",
}

// cleanAWSEnv empties the chain's variables and points HOME at an empty
// directory (no ~/.aws), so only what a test sets is found; the instance
// metadata service is off unless the test turns it on.
func cleanAWSEnv(t *testing.T) {
	t.Helper()
	for _, k := range awsEnv {
		t.Setenv(k, "")
	}
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

// chainClient is a client of s's bucket with no static keys: the chain's.
func chainClient(t *testing.T, s *objtest.Server) *obj.Minio {
	t.Helper()
	c, err := obj.NewMinio(obj.Endpoint{Endpoint: s.Endpoint, Bucket: bucket})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// roundTrip writes an object, reads it back and removes it: three signed
// requests the real server checks.
func roundTrip(t *testing.T, c *obj.Minio, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.Probe(ctx))
	require.NoError(t, c.Put(ctx, name, strings.NewReader("kv"), 2))
	size, err := c.Head(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, int64(2), size)
	require.NoError(t, c.Remove(ctx, name))
}

// refused asserts the real server refuses a write signed with c's
// credentials, with the typed error, and returns its S3 error code.
func refused(t *testing.T, c *obj.Minio) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.Put(ctx, "refused", strings.NewReader("kv"), 2)
	require.ErrorIs(t, err, obj.ErrAccessDenied)
	assert.NotErrorIs(t, err, messages.ErrNotFound)
	var resp minio.ErrorResponse
	require.True(t, errors.As(err, &resp), "an S3 error: %v", err)
	return resp.Code
}

// NB: versitygw accepts a session token only with keys its own STS minted
// and answers any other InvalidToken (before it checks the signature). So
// root keys with a session token are refused with that code: the token
// reached the server. The same keys without one are accepted.

// assertSessionTokenSent asserts that a chain client of s has the root keys
// with token as their session token, and that the token goes with its
// requests.
func assertSessionTokenSent(t *testing.T, s *objtest.Server, token string, msgAndArgs ...any) {
	t.Helper()
	c := chainClient(t, s)
	v, err := c.Raw().GetCreds()
	require.NoError(t, err)
	assert.Equal(t, credentials.Value{AccessKeyID: objtest.AccessKey, SecretAccessKey: objtest.SecretKey,
		SessionToken: token, SignerType: credentials.SignatureV4}, v, msgAndArgs...)
	assert.Equal(t, "InvalidToken", refused(t, c), "the token went with the request")
}

// assertRootKeysWithToken asserts that c's credentials, from the chain, are
// the root keys with token as their session token.
func assertRootKeysWithToken(t *testing.T, c *obj.Minio, token string, msgAndArgs ...any) {
	t.Helper()
	v, err := c.Raw().GetCreds()
	require.NoError(t, err)
	assert.Equal(t, objtest.AccessKey, v.AccessKeyID)
	assert.Equal(t, objtest.SecretKey, v.SecretAccessKey)
	assert.Equal(t, token, v.SessionToken, msgAndArgs...)
}

func TestCredentialsFromSharedFileProfile(t *testing.T) {
	s := objtest.Start(t, bucket)
	cleanAWSEnv(t)
	file := filepath.Join(t.TempDir(), "credentials")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`[default]
aws_access_key_id = %[1]s
aws_secret_access_key = not-the-secret

[kvtier]
aws_access_key_id = %[1]s
aws_secret_access_key = %[2]s

[kvtier-session]
aws_access_key_id = %[1]s
aws_secret_access_key = %[2]s
aws_session_token = file-session-token
`, objtest.AccessKey, objtest.SecretKey)), 0o600))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", file)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "absent"))

	t.Setenv("AWS_PROFILE", "kvtier")
	roundTrip(t, chainClient(t, s), "from-profile")

	t.Setenv("AWS_PROFILE", "kvtier-session")
	assertSessionTokenSent(t, s, "file-session-token", "the profile's session token is handed to the client")

	t.Setenv("AWS_PROFILE", "")
	assert.Equal(t, "SignatureDoesNotMatch", refused(t, chainClient(t, s)), "the default profile's secret is wrong")
}

func TestCredentialsFromEnvironment(t *testing.T) {
	s := objtest.Start(t, bucket)
	cleanAWSEnv(t)
	t.Setenv("AWS_ACCESS_KEY_ID", objtest.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", objtest.SecretKey)
	roundTrip(t, chainClient(t, s), "from-env")

	t.Setenv("AWS_SESSION_TOKEN", "env-session-token")
	assertSessionTokenSent(t, s, "env-session-token")
	t.Setenv("AWS_SESSION_TOKEN", "")

	// The environment comes before the file: a file's right keys do not
	// rescue the environment's wrong secret.
	file := filepath.Join(t.TempDir(), "credentials")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n",
		objtest.AccessKey, objtest.SecretKey)), 0o600))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", file)
	t.Setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
	assert.Equal(t, "SignatureDoesNotMatch", refused(t, chainClient(t, s)))

	// Static keys from the config come before everything.
	static, err := obj.NewMinio(obj.Endpoint{Endpoint: s.Endpoint, Bucket: bucket,
		AccessKey: objtest.AccessKey, SecretKey: objtest.SecretKey})
	require.NoError(t, err)
	defer static.Close()
	roundTrip(t, static, "static")
}

// issued is what a fake credential service hands out on its n-th call
// (from 1): a session token ("" for none) and an expiry.
type issued func(n int32) (token string, expires time.Time)

// staleThenFresh: the first keys carry a session token and are stale when
// they arrive (their expiry passed), so the next request fetches again;
// later keys last an hour, with no token (versitygw takes root keys only
// without one, see above).
func staleThenFresh(prefix string) issued {
	return func(n int32) (string, time.Time) {
		if n == 1 {
			return prefix + "-session-1", time.Now().Add(-time.Minute)
		}
		return "", time.Now().Add(time.Hour)
	}
}

// fakeSTS answers AssumeRoleWithWebIdentity as AWS STS documents it,
// handing out versitygw's root keys as issue says.
type fakeSTS struct {
	*httptest.Server
	calls atomic.Int32
	mu    sync.Mutex
	forms []url.Values
}

func startFakeSTS(t *testing.T, issue issued) *fakeSTS {
	f := &fakeSTS{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.ParseForm() != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.forms = append(f.forms, r.PostForm)
		f.mu.Unlock()
		n := f.calls.Add(1)
		token, expires := issue(n)
		w.Header().Set("Content-Type", "text/xml")
		fmt.Fprintf(w, `<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <Credentials>
      <AccessKeyId>%s</AccessKeyId>
      <SecretAccessKey>%s</SecretAccessKey>
      <SessionToken>%s</SessionToken>
      <Expiration>%s</Expiration>
    </Credentials>
    <Provider>oidc.eks.example</Provider>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>r-%d</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>`, objtest.AccessKey, objtest.SecretKey, token, expires.UTC().Format(time.RFC3339), n)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeSTS) form(i int) url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.forms[i]
}

// IRSA: the web identity token file and the role are in the environment;
// the token is exchanged at STS and the temporary keys sign the requests.
// Keys STS says are stale are exchanged again by the next request; fresh
// ones are kept.
func TestCredentialsFromWebIdentityExchangedAtSTS(t *testing.T) {
	s := objtest.Start(t, bucket)
	cleanAWSEnv(t)
	sts := startFakeSTS(t, staleThenFresh("sts"))
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte("projected-sa-token"), 0o600))
	t.Setenv("AWS_WEB_IDENTITY_TOKEN_FILE", token)
	t.Setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/kvtier")
	t.Setenv("AWS_ROLE_SESSION_NAME", "kvtierd")
	t.Setenv("AWS_ENDPOINT_URL_STS", sts.URL)
	// The instance metadata service (a closed port) is not asked: the web
	// identity comes first.
	t.Setenv("AWS_EC2_METADATA_DISABLED", "")
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1")

	c := chainClient(t, s)
	assertRootKeysWithToken(t, c, "sts-session-1", "STS's session token is handed to the client")
	form := sts.form(0)
	assert.Equal(t, "AssumeRoleWithWebIdentity", form.Get("Action"))
	assert.Equal(t, "projected-sa-token", form.Get("WebIdentityToken"), "the token file's content")
	assert.Equal(t, "arn:aws:iam::123456789012:role/kvtier", form.Get("RoleArn"))
	assert.Equal(t, "kvtierd", form.Get("RoleSessionName"))

	// The first keys are stale: the next request exchanges the token again
	// and signs with what it got, which the real server accepts.
	roundTrip(t, c, "from-sts")
	assert.Equal(t, int32(2), sts.calls.Load(), "exchanged again once stale")
	assert.Equal(t, "projected-sa-token", sts.form(1).Get("WebIdentityToken"))
	roundTrip(t, c, "still-from-sts")
	assert.Equal(t, int32(2), sts.calls.Load(), "fresh keys are kept")
}

// startFakeIMDS answers as EC2's instance metadata service documents it:
// IMDSv2's session token, the role's name, the role's credentials (as
// issue says). It counts the credentials it serves.
func startFakeIMDS(t *testing.T, issue issued) (*httptest.Server, *atomic.Int32) {
	var served atomic.Int32
	const role, imdsToken = "kvtier-node-role", "imds-v2-token"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/latest/api/token" {
			if r.Method != http.MethodPut || r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
				http.Error(w, "forbidden", http.StatusForbidden)
				return
			}
			fmt.Fprint(w, imdsToken)
			return
		}
		if r.Header.Get("X-aws-ec2-metadata-token") != imdsToken {
			http.Error(w, "unauthorized", http.StatusUnauthorized) // IMDSv2 required
			return
		}
		switch r.URL.Path {
		case "/latest/meta-data/iam/security-credentials/":
			fmt.Fprintln(w, role)
		case "/latest/meta-data/iam/security-credentials/" + role:
			token, expires := issue(served.Add(1))
			fmt.Fprintf(w, `{"Code": "Success", "LastUpdated": %q, "Type": "AWS-HMAC",
  "AccessKeyId": %q, "SecretAccessKey": %q, "Token": %q, "Expiration": %q}`,
				time.Now().UTC().Format(time.RFC3339), objtest.AccessKey, objtest.SecretKey, token,
				expires.UTC().Format(time.RFC3339))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &served
}

// A node's role through the instance metadata service (IMDSv2), when
// nothing comes before it.
func TestCredentialsFromInstanceMetadata(t *testing.T) {
	s := objtest.Start(t, bucket)
	cleanAWSEnv(t)
	imds, served := startFakeIMDS(t, staleThenFresh("imds"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "")
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.URL)

	c := chainClient(t, s)
	assertRootKeysWithToken(t, c, "imds-session-1", "the role's session token is handed to the client")
	roundTrip(t, c, "from-imds")
	assert.Equal(t, int32(2), served.Load(), "fetched again once stale")
	roundTrip(t, c, "still-from-imds")
	assert.Equal(t, int32(2), served.Load(), "fresh keys are kept")

	// Disabled: the service is not asked, and with nothing else found the
	// requests go unsigned and are refused.
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	assert.Equal(t, "AccessDenied", refused(t, chainClient(t, s)))
	assert.Equal(t, int32(2), served.Load())
}
