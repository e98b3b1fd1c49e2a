package cpu

import (
	"fmt"

	"github.com/kvtier/kvtier/messages"
)

func typeName(v any) string { return fmt.Sprintf("%T", v) }

func messagesChecksumError(k messages.Key, want, got uint32) error {
	return fmt.Errorf("%w: %v: want %08x, got %08x", messages.ErrChecksum, k, want, got)
}
