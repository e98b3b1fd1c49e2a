package config

import (
	"fmt"
	"os"

	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/obj"
	"github.com/kvtier/kvtier/tiers/p2p"
)

// TierConfig is one secondary tier of Config.SecondaryTiers. In YAML:
//
//	secondary_tiers:
//	  - {kind: fs, root: /var/lib/kvtier, capacity: 100GiB, fsync: false}
//	  - {kind: obj, endpoint: 127.0.0.1:7070, bucket: kv, prefix: node-a/}
type TierConfig struct {
	// Kind is "fs" or "obj".
	Kind string `yaml:"kind"`
	// Name names the tier in stats, metrics and ReqContext.TierFilter;
	// default: the kind (then kind2, kind3, ... for repeats).
	Name string `yaml:"name"`
	// Workers is the tier's I/O goroutines (fs default 4, obj default 16).
	Workers int `yaml:"workers"`
	// Locality is the `locality` of the tier's KV events: "LOCAL" or
	// "REMOTE" (defaults: fs LOCAL, obj REMOTE; a filesystem other nodes
	// mount is REMOTE).
	Locality string `yaml:"locality"`

	// fs: the root directory, byte capacity (0 = unbounded) and whether each
	// block file is fsynced before it is published.
	Root     string   `yaml:"root"`
	Capacity ByteSize `yaml:"capacity"`
	Fsync    bool     `yaml:"fsync"`
	// Layout is the fs tier's on-disk layout: "segments" (the default:
	// append-only segment files; block files already in the root are still
	// read) or "files" (one file per block).
	Layout string `yaml:"layout"`

	// obj: an S3-compatible endpoint (host:port), bucket and key prefix.
	Endpoint string `yaml:"endpoint"`
	Bucket   string `yaml:"bucket"`
	Prefix   string `yaml:"prefix"`
	Region   string `yaml:"region"`
	Secure   bool   `yaml:"secure"`
	// AccessKey and SecretKey are the obj tier's static keys (one of them
	// given: the other, when empty, from AWS_ACCESS_KEY_ID or
	// AWS_SECRET_ACCESS_KEY). Both empty: the credentials the pod is given,
	// the first of these found (tiers/obj.Credentials has the details):
	//
	//  1. the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
	//     AWS_SESSION_TOKEN;
	//  2. the shared credentials file: AWS_SHARED_CREDENTIALS_FILE (default
	//     ~/.aws/credentials), profile AWS_PROFILE (default "default"), its
	//     aws_session_token too;
	//  3. a web identity token (EKS IRSA: AWS_WEB_IDENTITY_TOKEN_FILE and
	//     AWS_ROLE_ARN) exchanged at STS; else the container credentials
	//     endpoint (ECS, EKS Pod Identity); else the instance metadata
	//     service (IMDS; skipped when AWS_EC2_METADATA_DISABLED=true).
	//
	// Temporary credentials are fetched again before they expire.
	AccessKey string `yaml:"access_key"`
	SecretKey string `yaml:"secret_key"`

	// FS replaces the real filesystem of an fs tier (fault injection in
	// tests); nil is the OS.
	FS fs.FS `yaml:"-"`
	// ObjClient replaces the S3 client of an obj tier (fault injection in
	// tests, obj.NewFaulty); nil is minio-go against Endpoint.
	ObjClient obj.Client `yaml:"-"`
}

// TierNames returns each tier's name, defaulted and made unique.
func TierNames(ts []TierConfig) []string {
	out := make([]string, len(ts))
	seen := map[string]int{}
	for i, t := range ts {
		name := t.Name
		if name == "" {
			name = t.Kind
			if n := seen[name]; n > 0 {
				name = fmt.Sprintf("%s%d", t.Kind, n+1)
			}
		}
		seen[t.Kind]++
		out[i] = name
	}
	return out
}

// Credentials returns the obj tier's static keys: the config's, a missing
// half from the standard environment variable. Neither in the config: both
// empty, and the tier walks the credential chain (AccessKey).
func (t TierConfig) Credentials() (access, secret string) {
	access, secret = t.AccessKey, t.SecretKey
	if access == "" && secret == "" {
		return "", ""
	}
	if access == "" {
		access = os.Getenv("AWS_ACCESS_KEY_ID")
	}
	if secret == "" {
		secret = os.Getenv("AWS_SECRET_ACCESS_KEY")
	}
	return access, secret
}

func validateTiers(c Config) error {
	if len(c.SecondaryTiers) > 63 {
		return badConfig("%d secondary tiers (max 63)", len(c.SecondaryTiers))
	}
	names := map[string]bool{}
	for i, name := range TierNames(c.SecondaryTiers) {
		t := c.SecondaryTiers[i]
		switch {
		case names[name]:
			return badConfig("secondary_tiers[%d]: name %q repeated", i, name)
		case name == tiers.CPU:
			return badConfig("secondary_tiers[%d]: name %q is the CPU tier's", i, name)
		case t.Workers < 0:
			return badConfig("secondary_tiers[%d]: workers %d must not be negative", i, t.Workers)
		case t.Locality != "" && t.Locality != "LOCAL" && t.Locality != "REMOTE":
			return badConfig("secondary_tiers[%d]: locality %q (want LOCAL or REMOTE)", i, t.Locality)
		case name == p2p.DefaultName && c.Peers.Enabled() && c.Peers.TierName == "":
			return badConfig("secondary_tiers[%d]: name %q is the P2P tier's", i, name)
		}
		names[name] = true
		switch t.Kind {
		case tiers.KindFS:
			if t.Root == "" {
				return badConfig("secondary_tiers[%d]: fs tier needs a root", i)
			}
			if t.Capacity < 0 {
				return badConfig("secondary_tiers[%d]: capacity %d must not be negative", i, t.Capacity)
			}
			if fs.ValidLayout(t.Layout) != nil {
				return badConfig("secondary_tiers[%d]: fs layout %q (want %s or %s)", i, t.Layout, fs.LayoutFiles, fs.LayoutSegments)
			}
		case tiers.KindObj:
			if t.Endpoint == "" || t.Bucket == "" {
				return badConfig("secondary_tiers[%d]: obj tier needs an endpoint and a bucket", i)
			}
		default:
			return badConfig("secondary_tiers[%d]: kind %q (want fs or obj)", i, t.Kind)
		}
	}
	return nil
}
