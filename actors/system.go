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
// An idle system wakes nothing (docs/DESIGN.md §2.2; measured by `kvtier
// bench idle`). Audited in protoactor-go v0.0.0-20240822202345: the
// process registry, event stream, guardians and extensions are plain data;
// a mailbox runs on a goroutine only while it has messages; no metrics
// exporter runs (MetricsProvider is nil, so the default Prometheus HTTP
// server is never started); the only timers are SetReceiveTimeout and
// futures (neither used here: deadlines are AfterFunc messages to self) and
// the dead-letter throttle below, which lives for one interval after a
// dead letter, never periodically.
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
