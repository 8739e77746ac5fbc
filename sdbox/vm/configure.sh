#!/bin/sh
# Run inside the image's chroot at build time (sdbox/vm/image.py), as root, with
# /proc and /dev bound and the wheelhouse at /tmp/wheels. Part of the recipe: any
# change here changes the image's hash, hence a rebuild.
set -eu

# What debootstrap cannot configure itself (podman's postinst), with apt-get; no
# service may start in the chroot.
printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
chmod 755 /usr/sbin/policy-rc.d
apt-get update -qq
# shellcheck disable=SC2046
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(cat /tmp/apt-packages.txt)
rm -f /usr/sbin/policy-rc.d

# Network: qemu's user-mode network always gives the guest 10.0.2.15; a static
# address is faster than DHCP and needs no client in the image.
cat >/etc/systemd/network/10-vm.network <<'EOF'
[Match]
Name=en* eth*

[Network]
Address=10.0.2.15/24
Gateway=10.0.2.2
DNS=10.0.2.3
EOF
systemctl enable systemd-networkd.service
echo sdbox-vm >/etc/hostname
printf '127.0.0.1\tlocalhost\n127.0.1.1\tsdbox-vm\n::1\tlocalhost ip6-localhost ip6-loopback\n' >/etc/hosts
printf '/dev/vda / ext4 rw,relatime 0 1\n' >/etc/fstab
# The checkout comes per boot on a second disk (sdbox/vm/machine.py), a throwaway copy:
# writable (tests write under it); nofail: a boot without it still comes up.
mkdir -p /src
printf '/dev/vdb /src ext4 rw,nofail 0 0\n' >>/etc/fstab

# Ready marker on the serial console: the host waits for this line, not polling ssh.
cat >/etc/systemd/system/sdbox-vm-ready.service <<'EOF'
[Unit]
Description=Tell the host (serial console) that the VM is up
After=multi-user.target ssh.service src.mount
Wants=ssh.service

[Service]
Type=simple
ExecStart=/bin/sh -c 'systemctl is-system-running --wait >/dev/null; echo "SDBOX-VM-READY $(systemctl is-system-running)" >/dev/ttyS0'

[Install]
WantedBy=multi-user.target
EOF
systemctl enable sdbox-vm-ready.service
# Nothing periodic that would compete for the (slow, emulated) CPUs during tests.
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
    man-db.timer dpkg-db-backup.timer logrotate.timer podman-auto-update.timer \
    podman-auto-update.service podman-restart.service systemd-networkd-wait-online.service \
    e2scrub_reap.service; do
    systemctl mask "$unit" >/dev/null 2>&1 || true
done
systemctl mask getty@tty1.service >/dev/null 2>&1 || true

# Logins by key only, for root and the ordinary users; the key is made per image.
mkdir -p /root/.ssh
install -m 600 /tmp/vm-key.pub /root/.ssh/authorized_keys
sed -i 's/^#\?PermitRootLogin.*/PermitRootLogin prohibit-password/' /etc/ssh/sshd_config
printf 'UseDNS no\nPasswordAuthentication no\n' >/etc/ssh/sshd_config.d/sdbox-vm.conf
uid=1001
for user in alice bob; do
    useradd --create-home --uid "$uid" --shell /bin/bash "$user"
    install -d -m 700 -o "$user" -g "$user" "/home/$user/.ssh"
    install -m 600 -o "$user" -g "$user" /tmp/vm-key.pub "/home/$user/.ssh/authorized_keys"
    uid=$((uid + 1))
done
# podman rootless needs subordinate ids
printf 'alice:100000:65536\nbob:200000:65536\n' >/etc/subuid
cp /etc/subuid /etc/subgid

# gpulaunch's Python dependencies, from the host-made wheelhouse (no network here);
# the checkout itself is found through a .pth file pointing at /src (the per-boot disk).
python3 -m venv /opt/gpulaunch-venv
/opt/gpulaunch-venv/bin/pip install -q --no-index --find-links /tmp/wheels -r /tmp/requirements.txt
site=$(/opt/gpulaunch-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo /src >"$site/sdbox-vm-checkout.pth"
cat >/usr/local/bin/gpulaunch <<'EOF'
#!/opt/gpulaunch-venv/bin/python
import sys

from gpulaunch.__main__ import main

sys.exit(main())
EOF
chmod 755 /usr/local/bin/gpulaunch
cp /usr/local/bin/gpulaunch /opt/gpulaunch-venv/bin/gpulaunch  # where the tests look
# Compile once at build time (native speed) rather than in the slow guest.
/opt/gpulaunch-venv/bin/python -m compileall -q "$site" >/dev/null || true

# A rootfs for containers (no registry inside the VM): podman run --rootfs /var/lib/sdbox-ct
# gets this very system's files (a copy without the kernel, docs and the container store).
mkdir -p /var/lib/sdbox-ct
tar -C / --one-file-system --exclude=./proc --exclude=./sys --exclude=./dev \
    --exclude=./boot --exclude=./usr/share/doc --exclude=./usr/share/man \
    --exclude=./var/lib/sdbox-ct --exclude=./var/lib/containers --exclude=./tmp \
    --exclude=./usr/lib/modules --exclude=./lib/modules --exclude=./var/cache/apt \
    -cf - . | tar -C /var/lib/sdbox-ct -xf -
mkdir -p /var/lib/sdbox-ct/proc /var/lib/sdbox-ct/sys /var/lib/sdbox-ct/dev /var/lib/sdbox-ct/tmp

# The same system as a base image in podman's store, for `podman build` without a registry
# (tests/vm/test_image.py: FROM localhost/sdbox-debian:12): Debian 12 with python3, systemd
# and dbus, without gpulaunch, its venv and apt's lists. Imported here at native speed; in
# the VM the import takes about 4 minutes. Nothing of podman's runtime state stays behind.
tar -C /var/lib/sdbox-ct --exclude=./opt/gpulaunch-venv --exclude=./usr/local/bin/gpulaunch \
    --exclude='./var/lib/apt/lists/*' --exclude='./var/cache/apt/*' -cf - . |
    podman --cgroup-manager=cgroupfs import --change 'CMD ["/bin/bash"]' - localhost/sdbox-debian:12
podman --cgroup-manager=cgroupfs image exists localhost/sdbox-debian:12
rm -rf /run/containers /run/libpod /var/tmp/buildah* /var/tmp/storage*

apt-get clean
rm -rf /var/lib/apt/lists/* /tmp/vm-key.pub
