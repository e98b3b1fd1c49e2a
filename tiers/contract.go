package tiers

// The secondary-tier contract. A secondary tier (tiers/fs, tiers/obj) is an
// actor that answers these messages (tiers/tiermsg) to their sender,
// echoing Corr, and never blocks its mailbox: every read, write, delete or
// network call runs on its Workers and comes back as a message.
//
//	tiermsg.Lookup{Keys}            → tiermsg.LookupResult{Found per key}
//	    Answered from the tier's index when it has one (fs), else by probes
//	    on its workers (obj). An unhealthy tier answers at once, Found all
//	    false, Err ErrTierUnavailable.
//	tiermsg.Read{Key, Dest}         → tiermsg.ReadResult{Checksum} | Err
//	    Reads the block into Dest (a slot the caller reserved) and verifies
//	    its stored CRC32C; a block that fails any check is removed, counted,
//	    and answered ErrInvalidBlock: never served. A Dest of another
//	    length than the stored block's is blockfmt.ErrSize: nothing is
//	    removed, Dest is untouched.
//	tiermsg.Write{Key, Src, Checksum} → tiermsg.WriteResult | Err
//	    Verifies Src against Checksum, then stores it so that a reader sees
//	    either nothing or the whole block (atomic publish). Full → ErrTierFull;
//	    queue full or unhealthy → ErrTierUnavailable (shed, counted). A Src
//	    of no bytes or over the tier's MaxBlockBytes is blockfmt.ErrSize.
//	tiermsg.Delete{Key}             (no reply) removes a bad copy.
//	tiermsg.StatsQuery              → tiermsg.StatsReply{SecondaryStats}
//
// The caller owns the slot memory's lifetime: it keeps the pin (write) or
// reservation (read) until the answer arrives, so a worker never touches a
// slot that was handed to someone else.

// Kinds of secondary tier, as named in the config and in TierFilter.
const (
	KindFS  = "fs"
	KindObj = "obj"
	// CPU names the primary tier in a TierFilter; it is always consulted.
	CPU = "cpu"
)
