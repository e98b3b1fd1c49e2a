package client

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// An engine that links the client gets the engine API and a socket, not
// the node: no actor system, no S3 client, no metrics, no logger.
func TestClientDependsOnNoneOfTheNode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	require.NoError(t, err)
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/asynkron/protoactor-go", "github.com/minio/minio-go",
			"github.com/prometheus/", "github.com/rs/zerolog", "go.opentelemetry.io/",
			"github.com/kvtier/kvtier/tiers", "github.com/kvtier/kvtier/peer",
		} {
			require.False(t, strings.HasPrefix(dep, banned), "the client pulls in %s", dep)
		}
		require.NotEqual(t, "github.com/kvtier/kvtier", dep, "the client imports the node")
	}
}
