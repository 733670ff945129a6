// SPDX-License-Identifier: Apache-2.0

package reconcilertest

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// OpKind says which Datapath method an Op records.
type OpKind uint8

// The operation kinds, one per reconciler.Datapath and
// reconciler.TableBatcher method.
const (
	OpSetBackend OpKind = iota + 1
	OpDeleteBackend
	OpSetTable
	OpDeleteTable
	OpSetService
	OpDeleteService
	// OpSetTables and OpDeleteTables open a batch; the batch's entries
	// follow as OpSetTable and OpDeleteTable ops with Op.Batch set.
	OpSetTables
	OpDeleteTables
)

var kindNames = [...]string{
	OpSetBackend:    "SetBackend",
	OpDeleteBackend: "DeleteBackend",
	OpSetTable:      "SetTable",
	OpDeleteTable:   "DeleteTable",
	OpSetService:    "SetService",
	OpDeleteService: "DeleteService",
	OpSetTables:     "SetTables",
	OpDeleteTables:  "DeleteTables",
}

// String returns the name of the Datapath method.
func (k OpKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("op-%d", uint8(k))
}

// Op is one call the fake received, with its arguments copied.
type Op struct {
	Kind OpKind
	// Service is the service id of every kind but DeleteBackend and the
	// two that open a batch; for SetBackend it is the owner in the
	// backend entry.
	Service reconciler.ServiceID
	// Backend, Addr and State are set for SetBackend; Backend also for
	// DeleteBackend.
	Backend reconciler.BackendID
	Addr    netip.AddrPort
	State   lb.BackendState
	// Frontend is set for SetService and DeleteService, Entry (the output
	// of reconciler.Entry) for SetService.
	Frontend lb.Frontend
	Entry    lb.Service
	// Table is set for SetTable; it is never nil, even when empty.
	Table []reconciler.BackendID
	// Batch is, for SetTables and DeleteTables, the number of entries in
	// the batch, and for a SetTable or DeleteTable that is one of them,
	// its position in the batch from 1; it is 0 for a call on its own.
	Batch int
	// Err is why the operation failed (injected or refused by the fake);
	// nil when it was applied.
	Err error
}

func (o Op) clone() Op {
	o.Table = slices.Clone(o.Table)
	o.Entry.SourceRanges = slices.Clone(o.Entry.SourceRanges)
	return o
}

// IsBatch reports whether o opens a batch (SetTables or DeleteTables)
// rather than writing an entry itself.
func (o Op) IsBatch() bool { return o.Kind == OpSetTables || o.Kind == OpDeleteTables }

// String prints the call the way tests spell expected sequences, e.g.
// "SetBackend(3, 10.1.0.1:80 service=1 active)", "SetTables(2 entries)" or,
// for an entry of that batch, "SetTable(1, [1 2 1]) in batch"; a failed call
// ends in " failed: " and the error.
func (o Op) String() string {
	var s string
	switch o.Kind {
	case OpSetBackend:
		s = fmt.Sprintf("SetBackend(%d, %s service=%d %s)", o.Backend, o.Addr, o.Service, o.State)
	case OpDeleteBackend:
		s = fmt.Sprintf("DeleteBackend(%d)", o.Backend)
	case OpSetTable:
		if len(o.Table) <= maxListed {
			s = fmt.Sprintf("SetTable(%d, [%s])", o.Service, formatTable(o.Table))
		} else {
			s = fmt.Sprintf("SetTable(%d, %d slots)", o.Service, len(o.Table))
		}
	case OpDeleteTable:
		s = fmt.Sprintf("DeleteTable(%d)", o.Service)
	case OpSetService:
		s = fmt.Sprintf("SetService(%d, %s %s)", o.Service, o.Frontend, formatEntry(o.Entry))
	case OpDeleteService:
		s = fmt.Sprintf("DeleteService(%d, %s)", o.Service, o.Frontend)
	case OpSetTables, OpDeleteTables:
		s = fmt.Sprintf("%s(%d entries)", o.Kind, o.Batch)
	default:
		s = o.Kind.String()
	}
	if o.Batch > 0 && !o.IsBatch() {
		s += " in batch"
	}
	if o.Err != nil {
		s += " failed: " + o.Err.Error()
	}
	return s
}
