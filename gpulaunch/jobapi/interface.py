"""io.gpulaunch.Job1 as shipped: its introspection data, signal signatures, the bus policy.

The interface itself is packaging/dbus/io.gpulaunch.Job1.xml (one source of
truth, docs/dbus.md); the publisher serves it with the standard interfaces below.
"""

from __future__ import annotations

from pathlib import Path

from gpulaunch import shipped
from gpulaunch.jobapi.rankview import RANK_SIGNATURE
from gpulaunch.jobapi.view import INTERFACE

# Signal signatures (packaging/dbus/io.gpulaunch.Job1.xml has their argument names).
RANK_EXITED_SIGNATURE = "isiibi"
FINISHED_SIGNATURE = "sisia" + RANK_SIGNATURE

# Properties read on demand and never in PropertiesChanged (EmitsChangedSignal=false).
UNANNOUNCED = frozenset({"LastOutput", "Steps", "Goodput", "Phases"})

STANDARD_INTERFACES = """\
  <interface name="org.freedesktop.DBus.Peer">
    <method name="Ping"/>
    <method name="GetMachineId"><arg name="machine_uuid" type="s" direction="out"/></method>
  </interface>
  <interface name="org.freedesktop.DBus.Introspectable">
    <method name="Introspect"><arg name="xml_data" type="s" direction="out"/></method>
  </interface>
  <interface name="org.freedesktop.DBus.Properties">
    <method name="Get">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg name="value" type="v" direction="out"/>
    </method>
    <method name="GetAll">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="props" type="a{sv}" direction="out"/>
    </method>
    <method name="Set">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg name="value" type="v" direction="in"/>
    </method>
    <signal name="PropertiesChanged">
      <arg name="interface_name" type="s"/>
      <arg name="changed_properties" type="a{sv}"/>
      <arg name="invalidated_properties" type="as"/>
    </signal>
  </interface>
"""


def packaging_dir() -> Path:
    """`packaging/dbus`: the D-Bus files the package ships (a wheel carries them)."""
    return shipped.packaging_dir() / "dbus"


def interface_xml() -> str:
    """The introspection data of io.gpulaunch.Job1, as shipped."""
    return (packaging_dir() / f"{INTERFACE}.xml").read_text()
