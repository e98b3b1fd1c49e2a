package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/peer/discovery"
	"github.com/kvtier/kvtier/tools/fleet"
)

// newFleetCmd builds `kvtier fleet`: the operator's view of the nodes that
// found each other through etcd (peers.discovery).
func newFleetCmd() *cobra.Command {
	o := fleet.Options{Prefix: discovery.DefaultPrefix, Timeout: 2 * time.Second}
	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "the fleet's nodes from etcd, each with its readiness, blocks per tier, hit rate and peer sessions (from its /readyz and /metrics)",
		RunE: func(c *cobra.Command, _ []string) error {
			if len(o.Endpoints) == 0 {
				return fmt.Errorf("fleet status: --etcd is required")
			}
			r, err := fleet.Status(c.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(r)
			}
			return printFleetStatus(os.Stdout, r)
		},
	}
	status.Flags().StringSliceVar(&o.Endpoints, "etcd", nil, "etcd client URLs (host:port or http://host:port), comma-separated")
	status.Flags().StringVar(&o.Prefix, "prefix", o.Prefix, "the fleet's key prefix (peers.discovery.prefix)")
	status.Flags().DurationVar(&o.Timeout, "timeout", o.Timeout, "bound on each etcd request and each node's HTTP calls")
	status.Flags().BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	return withCommands(&cobra.Command{Use: "fleet", Short: "the operator's view of a fleet found through etcd"}, status)
}

func printFleetStatus(out io.Writer, r fleet.Report) error {
	tiers := r.Tiers()
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	head := []string{"NODE", "READY"}
	for _, t := range tiers {
		head = append(head, "BLOCKS:"+strings.ToUpper(t))
	}
	head = append(head, "HIT RATE", "PEERS READY", "SERVING", "FETCHED", "ASKS/MISS", "DIRECTORY", "ETCD", "ERROR")
	fmt.Fprintln(w, strings.Join(head, "\t"))
	for _, n := range r.Nodes {
		row := []string{n.Node, yesNo(n.Ready)}
		for _, t := range tiers {
			if b, ok := n.Blocks[t]; ok {
				row = append(row, fmt.Sprintf("%.0f", b))
			} else {
				row = append(row, "-")
			}
		}
		row = append(row, fmt.Sprintf("%.3f", n.HitRate), fmt.Sprint(n.PeersReady), fmt.Sprint(n.PeersServing),
			fmt.Sprintf("%.0f", n.PeerFetched), fmt.Sprintf("%.2f", n.MessagesPerMiss), fmt.Sprintf("%.0f", n.DirectoryKeys),
			upDown(n.DiscoveryUp), n.Err)
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
	for key, why := range r.BadRecords {
		fmt.Fprintf(w, "bad record %s: %s\n", key, why)
	}
	fmt.Fprintf(w, "%d nodes\n", len(r.Nodes))
	return w.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func upDown(b bool) string {
	if b {
		return "up"
	}
	return "down"
}
