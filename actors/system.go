package actors

import (
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// NewSystem starts an actor system whose own logs go to log through
// zerolog's slog handler, at warn level and above: protoactor logs every
// start at info, which is noise for an embedded runtime.
//
// NB: protoactor throttles its dead-letter log with a goroutine that sleeps
// one throttle interval after the first dead letter of a burst. Stopping a
// tree routinely sends a system message to an already-stopped child, so a
// 1 s interval would leave that goroutine (and a wakeup) behind every Close.
// Those logs are info-level, below what we keep, so the window is short.
func NewSystem(log zerolog.Logger) *actor.ActorSystem {
	quiet := log.Level(maxLevel(log.GetLevel(), zerolog.WarnLevel))
	return actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
			return slog.New(zerolog.NewSlogHandler(quiet))
		}),
		actor.WithDeadLetterThrottleInterval(deadLetterThrottle),
	)
}

const deadLetterThrottle = 10 * time.Millisecond

func maxLevel(a, b zerolog.Level) zerolog.Level {
	if a > b {
		return a
	}
	return b
}
