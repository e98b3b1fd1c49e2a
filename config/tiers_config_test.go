package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Static keys come from the config (a missing half from the environment);
// with neither in the config the tier walks the credential chain, which
// reads the environment itself (with its session token).
func TestObjCredentialsStaticOnlyFromTheConfig(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "env-access")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
	for name, c := range map[string]struct {
		tier           TierConfig
		access, secret string
	}{
		"none: the chain": {TierConfig{}, "", ""},
		"both":            {TierConfig{AccessKey: "a", SecretKey: "s"}, "a", "s"},
		"access only":     {TierConfig{AccessKey: "a"}, "a", "env-secret"},
		"secret only":     {TierConfig{SecretKey: "s"}, "env-access", "s"},
	} {
		access, secret := c.tier.Credentials()
		assert.Equal(t, c.access, access, name)
		assert.Equal(t, c.secret, secret, name)
	}
}
