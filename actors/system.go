package actors

import (
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// NewSystem starts an actor system whose own logs go to log through
// zerolog's slog handler, at warn level and above: protoactor logs every
// start at info, which is noise for an embedded runtime.
func NewSystem(log zerolog.Logger) *actor.ActorSystem {
	quiet := log.Level(maxLevel(log.GetLevel(), zerolog.WarnLevel))
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(zerolog.NewSlogHandler(quiet))
	}))
}

func maxLevel(a, b zerolog.Level) zerolog.Level {
	if a > b {
		return a
	}
	return b
}
