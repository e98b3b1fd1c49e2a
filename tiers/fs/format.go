package fs

import (
	"path/filepath"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// The on-disk block format (header layout, checksums, names) is shared
// with the object tier: tiers/blockfmt. These are the fs tier's names for its constants.
const (
	headerSize   = blockfmt.HeaderSize
	maxNamespace = blockfmt.MaxNamespace
	blockExt     = blockfmt.Ext
	tmpMarker    = ".tmp."
)

// relPath is the key's file, relative to the root.
func relPath(k messages.Key) string { return filepath.FromSlash(blockfmt.RelPath(k)) }

// HeaderSize is the bytes each block file adds to its block: a tier of
// capacity N × (block + HeaderSize) holds N blocks (files layout; a
// segment adds 8 bytes a block and 56 a segment, and evicts whole
// segments).
const HeaderSize = headerSize
