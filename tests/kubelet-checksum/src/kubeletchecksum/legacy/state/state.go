// Package state declares the checkpoint as kubelets before pod-level resource managers wrote it:
// the same type name, without pod entries.
package state

import (
	"kubeletchecksum/checksum"
	current "kubeletchecksum/state"
)

type MemoryManagerCheckpoint struct {
	PolicyName   string                             `json:"policyName"`
	MachineState current.NUMANodeMap                `json:"machineState"`
	Entries      current.ContainerMemoryAssignments `json:"entries,omitempty"`
	Checksum     checksum.Checksum                  `json:"checksum"`
}

// New is an empty checkpoint as the kubelet makes one before reading a file into it.
func New() *MemoryManagerCheckpoint {
	return &MemoryManagerCheckpoint{
		MachineState: current.NUMANodeMap{},
		Entries:      current.ContainerMemoryAssignments{},
	}
}

// CheckpointV3 is the newest kubelet's file: the legacy checkpoint inline (for kubelets that
// predate it), the data as a JSON string, and the data's checksum.
type CheckpointV3 struct {
	MemoryManagerCheckpoint `json:",inline"`
	Data                    string            `json:"data"`
	DataChecksum            checksum.Checksum `json:"dataChecksum"`
}
