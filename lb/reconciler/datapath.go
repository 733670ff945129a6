// SPDX-License-Identifier: Apache-2.0

package reconciler

import (
	"net/netip"
	"slices"

	"github.com/l4lb/l4lb/lb"
)

// ServiceID names a service inside the datapath. The datapath indexes arrays
// (tables, counters) with it, so ids are small: 1..Config.MaxServices.
type ServiceID uint32

// BackendID names one backend of one service inside the datapath; the same
// address in two services gets two ids because state such as draining is per
// service. Ids are 1..Config.MaxBackends.
type BackendID uint32

// NoService and NoBackend are the zero ids: the datapath reads them as
// "no entry", so they are never allocated.
const (
	NoService ServiceID = 0
	NoBackend BackendID = 0
)

// Backend is a backend entry as the datapath stores it. The weight is not
// here: it only shapes the Maglev table, so a weight change rewrites the table
// and leaves this entry alone.
type Backend struct {
	Addr netip.AddrPort
	// Service owns the entry. The datapath compares it with the service a
	// packet matched, so a connection-tracking entry left over from an old
	// service can never reach a backend that now belongs to another one.
	Service ServiceID
	// State is Active, Draining or Disabled. A disabled backend keeps its
	// entry, so its id and counters, but the datapath sends it nothing:
	// neither new flows (it is in no table) nor established ones.
	State lb.BackendState
}

// Datapath is what the reconciler needs from the kernel side. lb/datapath
// implements it on BPF maps; reconcilertest.Fake implements it in memory.
//
// Each call must be atomic: when it returns an error nothing changed, and the
// reconciler will issue it again on its next pass. The reconciler orders calls
// so that the datapath never holds a service entry without its table, nor a
// table that names a backend id that is absent or owned by another service.
// A datapath that can swap many tables for the price of one also implements
// TableBatcher.
type Datapath interface {
	// SetBackend creates or replaces the backend entry at id.
	SetBackend(id BackendID, b Backend) error
	// DeleteBackend removes the backend entry at id. No table references it
	// any more when this is called.
	DeleteBackend(id BackendID) error
	// SetTable replaces the service's Maglev table: in one step (build
	// aside, swap in), or slot by slot when every slot is written whole
	// and a packet reads one slot, so that it sees the old table's
	// backend or the new one's, never anything else. table has TableSize slots, or none when the service has no
	// eligible backend. The table carries its own size: the datapath must
	// index it by its own length, never by the size in the service entry,
	// so a table of a new size can be swapped in before the entry changes.
	// The slice is only valid during the call.
	SetTable(svc ServiceID, table []BackendID) error
	// DeleteTable removes the service's table; no service entry points to it
	// any more when this is called.
	DeleteTable(svc ServiceID) error
	// SetService creates or replaces the service entry keyed by
	// svc.Frontend. svc is always the output of Entry, so only the fields the
	// entry holds are set; the datapath must not modify its slices.
	SetService(id ServiceID, svc lb.Service) error
	// DeleteService removes the service entry keyed by fe, which holds id.
	DeleteService(id ServiceID, fe lb.Frontend) error
}

// TableBatcher is implemented by datapaths for which swapping many tables at
// once costs much less than swapping them one by one. The BPF datapath is
// one: the kernel waits for an RCU grace period (milliseconds) after every
// write to a map-in-map, but only once per batch. The reconciler uses it
// when a pass swaps or deletes more than one table; a single table still
// goes through SetTable or DeleteTable.
//
// Both methods return exactly one error per entry, in order: nil means that
// entry is done, and an entry that failed changed nothing for its service,
// as with SetTable. Entries are independent: any of them may fail while the
// others succeed. When the kernel does not say how far a failed batch got,
// the datapath reads the entries back before it answers; an entry whose
// outcome stays unknown reports an error. The reconciler issues a failed
// entry again on its next pass, and treats a result slice of the wrong
// length as every entry failed.
type TableBatcher interface {
	// SetTables swaps in tables[i] for svcs[i], each with the contract of
	// SetTable. The ids are distinct; the slices are only valid during
	// the call.
	SetTables(svcs []ServiceID, tables [][]BackendID) []error
	// DeleteTables removes the tables of svcs, each with the contract of
	// DeleteTable. The ids are distinct.
	DeleteTables(svcs []ServiceID) []error
}

// Entry returns the part of svc that the datapath's service entry holds:
// frontend, mode, dispatch, table size, algorithm, affinity and source ranges
// (masked, sorted, without duplicates, so that two spellings of one allow-list
// compare equal). The name, source, health check and backends stay in the
// control plane. The reconciler compares entries with it to decide whether a
// SetService is needed, and a datapath that reports its contents for a
// restore should report values that Entry maps to the same result.
func Entry(svc lb.Service) lb.Service {
	return lb.Service{
		Frontend:     svc.Frontend,
		Mode:         svc.Mode,
		Dispatch:     svc.Dispatch,
		TableSize:    svc.TableSize,
		Algorithm:    svc.Algorithm,
		Affinity:     svc.Affinity,
		SourceRanges: canonicalPrefixes(svc.SourceRanges),
	}
}

func canonicalPrefixes(in []netip.Prefix) []netip.Prefix {
	if len(in) == 0 {
		return nil
	}
	out := make([]netip.Prefix, len(in))
	for i, p := range in {
		out[i] = p.Masked()
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}

// entryEqual reports whether two outputs of Entry program the same entry.
func entryEqual(a, b *lb.Service) bool {
	return a.Frontend == b.Frontend &&
		a.Mode == b.Mode &&
		a.Dispatch == b.Dispatch &&
		a.TableSize == b.TableSize &&
		a.Algorithm == b.Algorithm &&
		a.Affinity == b.Affinity &&
		slices.Equal(a.SourceRanges, b.SourceRanges)
}
